//! A listener whose every request goes to one async function: the S3 front and the peer
//! front, which route by what they parse themselves, not by path.
//!
//! They were `axum::Router::new().fallback(handle)`. axum serves a fallback as a catch-all
//! route, so every request was matched against it (matchit), had its empty path parameters
//! stored in its extensions (a map allocated per request), and went through the router's
//! boxed service and its futures: about 3,100 instructions of a 4 KiB hit's 33,000, 9 %
//! (docs/benchmarks.md, "The S3 front without axum's router").

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use futures::future::Map;
use futures::FutureExt;
use http::{header, HeaderValue, Method};
use http_body::Body as _;

/// What a handler's future is mapped by: it finishes the response as axum's router did.
type Finish = fn(Response) -> Result<Response, Infallible>;

/// Every request to `handle`, with `state`. A tower (and so hyper) service.
pub struct Handler<S, F> {
    state: Arc<S>,
    handle: fn(Arc<S>, Request) -> F,
}

impl<S, F> Handler<S, F> {
    pub fn new(state: Arc<S>, handle: fn(Arc<S>, Request) -> F) -> Self {
        Self { state, handle }
    }
}

impl<S, F> Clone for Handler<S, F> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            handle: self.handle,
        }
    }
}

impl<S, F, B> tower::Service<http::Request<B>> for Handler<S, F>
where
    F: Future<Output = Response>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Map<F, Finish>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let finishing: Finish = if req.method() == Method::HEAD {
            finish_head
        } else {
            finish
        };
        // `Body::new` takes an axum body as it is, and boxes hyper's (as the router did).
        (self.handle)(self.state.clone(), req.map(Body::new)).map(finishing)
    }
}

/// A `Content-Length` from a body of known length, where the handler set none: what axum's
/// router added to every answer. hyper adds it too, except to an answer to a HEAD, whose body
/// [`finish_head`] takes away.
fn finish(mut response: Response) -> Result<Response, Infallible> {
    set_length(&mut response);
    Ok(response)
}

/// An answer to a HEAD carries the headers of the GET's, and no body (over HTTP/2 hyper
/// would send one).
fn finish_head(mut response: Response) -> Result<Response, Infallible> {
    set_length(&mut response);
    *response.body_mut() = Body::empty();
    Ok(response)
}

fn set_length(response: &mut Response) {
    if !response.headers().contains_key(header::CONTENT_LENGTH) {
        if let Some(n) = response.body().size_hint().exact() {
            response
                .headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    async fn echo(state: Arc<String>, req: Request) -> Response {
        let body = format!("{} {} {}", state, req.method(), req.uri().path());
        Response::new(Body::from(body))
    }

    fn get(method: Method) -> http::Request<Body> {
        http::Request::builder()
            .method(method)
            .uri("/bucket/key")
            .body(Body::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn every_request_reaches_the_handler_with_its_state_and_a_length() {
        let service = Handler::new(Arc::new("state".to_owned()), echo);
        let response = service.clone().oneshot(get(Method::GET)).await.unwrap();
        assert_eq!(response.headers()[header::CONTENT_LENGTH], "21");
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        assert_eq!(&body[..], b"state GET /bucket/key");
    }

    #[tokio::test]
    async fn an_answer_to_a_head_has_the_length_and_no_body() {
        let service = Handler::new(Arc::new("state".to_owned()), echo);
        let response = service.oneshot(get(Method::HEAD)).await.unwrap();
        assert_eq!(response.headers()[header::CONTENT_LENGTH], "22");
        assert!(response.body().is_end_stream());
    }
}
