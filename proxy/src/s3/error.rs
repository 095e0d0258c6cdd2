//! S3 errors as clients expect them: a code, an HTTP status and an XML body.

use axum::body::Body;
use axum::response::Response;
use http::{header, HeaderValue, Method, StatusCode};

use crate::model::UpstreamError;
use crate::s3::headers::names;

/// An error answered to an S3 client. Each variant is one S3 error code; [`S3Error::Upstream`]
/// carries a code the upstream gave us, passed through unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum S3Error {
    /// 404 NoSuchKey.
    #[error("The specified key does not exist.")]
    NoSuchKey,
    /// 416 InvalidRange; the response carries `Content-Range: bytes */<size>`.
    #[error("The requested range is not satisfiable")]
    InvalidRange {
        /// The object's size.
        size: u64,
    },
    /// 412 PreconditionFailed.
    #[error("At least one of the pre-conditions you specified did not hold")]
    PreconditionFailed,
    /// 400 InvalidURI.
    #[error("Couldn't parse the specified URI.")]
    InvalidUri,
    /// 400 KeyTooLongError.
    #[error("Your key is too long")]
    KeyTooLong,
    /// 400 InvalidBucketName.
    #[error("The specified bucket is not valid.")]
    InvalidBucketName,
    /// 400 InvalidArgument.
    #[error("{0}")]
    InvalidArgument(String),
    /// 501 NotImplemented.
    #[error("{0}")]
    NotImplemented(String),
    /// 405 MethodNotAllowed.
    #[error("The specified method is not allowed against this resource.")]
    MethodNotAllowed,
    /// 403 InvalidAccessKeyId: the access key is not one Larder knows.
    #[error("The AWS Access Key Id you provided does not exist in our records.")]
    InvalidAccessKeyId,
    /// 403 SignatureDoesNotMatch.
    #[error("The request signature we calculated does not match the signature you provided. Check your key and signing method.")]
    SignatureDoesNotMatch,
    /// 403 AccessDenied: unsigned, expired, or not allowed by the key's policy.
    #[error("{0}")]
    AccessDenied(String),
    /// 400 AuthorizationHeaderMalformed.
    #[error("{0}")]
    AuthorizationHeaderMalformed(String),
    /// 400 AuthorizationQueryParametersError: a presigned URL's parameters are malformed.
    #[error("{0}")]
    AuthorizationQueryParametersError(String),
    /// 403 RequestTimeTooSkewed.
    #[error("The difference between the request time and the current time is too large.")]
    RequestTimeTooSkewed,
    /// 400 InvalidRequest.
    #[error("{0}")]
    InvalidRequest(String),
    /// 400 IncompleteBody: a streamed upload's framing or length is wrong.
    #[error("{0}")]
    IncompleteBody(String),
    /// 400 MalformedPOSTRequest: a browser-form upload's body is not well-formed
    /// multipart/form-data.
    #[error("{0}")]
    MalformedPostRequest(String),
    /// 400 EntityTooSmall / EntityTooLarge: a form upload's file is outside the policy's
    /// `content-length-range`.
    #[error("Your proposed upload is {0} than the policy allows")]
    EntitySize(&'static str),
    /// 411 MissingContentLength.
    #[error("You must provide the Content-Length HTTP header.")]
    MissingContentLength,
    /// 400 MaxMessageLengthExceeded: a body Larder must read itself is over its cap.
    #[error("Your request was too big.")]
    MaxMessageLengthExceeded,
    /// 503 ServiceUnavailable: the upstream could not be reached or did not answer in time.
    #[error("{0}")]
    ServiceUnavailable(String),
    /// 503 SlowDown: the client's key sent more requests than its policy allows a second
    /// (`crate::qos`). Every SDK retries it with backoff.
    #[error("Please reduce your request rate.")]
    SlowDown,
    /// 500 InternalError.
    #[error("We encountered an internal error. Please try again.")]
    InternalError,
    /// An error the upstream answered, passed through with its own code and status
    /// (AccessDenied, NoSuchBucket, SlowDown, InternalError, ...).
    #[error("{message}")]
    Upstream {
        /// HTTP status the upstream answered.
        status: u16,
        /// The upstream's S3 error code.
        code: String,
        /// The upstream's message.
        message: String,
    },
}

/// What S3 would have answered for an upstream failure: the upstream's own error passes
/// through; a failure to reach it is 503 (clients retry); anything else is Larder's fault (500).
impl From<UpstreamError> for S3Error {
    fn from(error: UpstreamError) -> Self {
        match error {
            UpstreamError::Service {
                status,
                code,
                message,
            } => S3Error::Upstream {
                status,
                code,
                message,
            },
            UpstreamError::Transport(m) | UpstreamError::Tls(m) | UpstreamError::Timeout(m) => {
                S3Error::ServiceUnavailable(format!("upstream unavailable: {m}"))
            }
            UpstreamError::Changed
            | UpstreamError::BodyLength { .. }
            | UpstreamError::Abandoned
            | UpstreamError::Internal(_) => S3Error::InternalError,
        }
    }
}

impl S3Error {
    /// The S3 error code.
    pub fn code(&self) -> &str {
        match self {
            S3Error::NoSuchKey => "NoSuchKey",
            S3Error::InvalidRange { .. } => "InvalidRange",
            S3Error::PreconditionFailed => "PreconditionFailed",
            S3Error::InvalidUri => "InvalidURI",
            S3Error::KeyTooLong => "KeyTooLongError",
            S3Error::InvalidBucketName => "InvalidBucketName",
            S3Error::InvalidArgument(_) => "InvalidArgument",
            S3Error::NotImplemented(_) => "NotImplemented",
            S3Error::MethodNotAllowed => "MethodNotAllowed",
            S3Error::ServiceUnavailable(_) => "ServiceUnavailable",
            S3Error::SlowDown => "SlowDown",
            S3Error::InvalidAccessKeyId => "InvalidAccessKeyId",
            S3Error::SignatureDoesNotMatch => "SignatureDoesNotMatch",
            S3Error::AccessDenied(_) => "AccessDenied",
            S3Error::AuthorizationHeaderMalformed(_) => "AuthorizationHeaderMalformed",
            S3Error::AuthorizationQueryParametersError(_) => "AuthorizationQueryParametersError",
            S3Error::RequestTimeTooSkewed => "RequestTimeTooSkewed",
            S3Error::InvalidRequest(_) => "InvalidRequest",
            S3Error::IncompleteBody(_) => "IncompleteBody",
            S3Error::MissingContentLength => "MissingContentLength",
            S3Error::MalformedPostRequest(_) => "MalformedPOSTRequest",
            S3Error::EntitySize("smaller") => "EntityTooSmall",
            S3Error::EntitySize(_) => "EntityTooLarge",
            S3Error::MaxMessageLengthExceeded => "MaxMessageLengthExceeded",
            S3Error::InternalError => "InternalError",
            S3Error::Upstream { code, .. } => code,
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            S3Error::NoSuchKey => StatusCode::NOT_FOUND,
            S3Error::InvalidRange { .. } => StatusCode::RANGE_NOT_SATISFIABLE,
            S3Error::PreconditionFailed => StatusCode::PRECONDITION_FAILED,
            S3Error::InvalidUri
            | S3Error::KeyTooLong
            | S3Error::InvalidBucketName
            | S3Error::InvalidArgument(_)
            | S3Error::AuthorizationHeaderMalformed(_)
            | S3Error::AuthorizationQueryParametersError(_)
            | S3Error::InvalidRequest(_)
            | S3Error::IncompleteBody(_)
            | S3Error::MalformedPostRequest(_)
            | S3Error::EntitySize(_)
            | S3Error::MaxMessageLengthExceeded => StatusCode::BAD_REQUEST,
            S3Error::InvalidAccessKeyId
            | S3Error::SignatureDoesNotMatch
            | S3Error::AccessDenied(_)
            | S3Error::RequestTimeTooSkewed => StatusCode::FORBIDDEN,
            S3Error::MissingContentLength => StatusCode::LENGTH_REQUIRED,
            S3Error::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            S3Error::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            S3Error::ServiceUnavailable(_) | S3Error::SlowDown => StatusCode::SERVICE_UNAVAILABLE,
            S3Error::InternalError => StatusCode::INTERNAL_SERVER_ERROR,
            S3Error::Upstream { status, .. } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY)
            }
        }
    }

    /// The response S3 would give. HEAD responses carry no body, as with S3.
    pub fn into_response(self, method: &Method, resource: &str, request_id: &str) -> Response {
        let status = self.status();
        let mut builder = Response::builder()
            .status(status)
            .header(names::X_CACHE, "error");
        if let Some(v) = super::headers::request_id(request_id) {
            builder = builder.header(names::X_AMZ_REQUEST_ID, v);
        }
        if let S3Error::InvalidRange { size } = self {
            builder = builder.header(header::CONTENT_RANGE, format!("bytes */{size}"));
        }
        let body = if method == Method::HEAD {
            Body::empty()
        } else {
            builder = builder.header(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/xml"),
            );
            Body::from(self.to_xml(resource, request_id))
        };
        builder
            .body(body)
            .unwrap_or_else(|_| Response::new(Body::empty()))
    }

    /// The XML error document.
    pub fn to_xml(&self, resource: &str, request_id: &str) -> String {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code><Message>{}</Message><Resource>{}</Resource><RequestId>{}</RequestId></Error>",
            xml_escape(self.code()),
            xml_escape(&self.to_string()),
            xml_escape(resource),
            xml_escape(request_id)
        )
    }
}

fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_statuses_and_xml() {
        let e = S3Error::InvalidRange { size: 10 };
        assert_eq!(e.code(), "InvalidRange");
        assert_eq!(e.status(), StatusCode::RANGE_NOT_SATISFIABLE);
        let r = e.into_response(&Method::GET, "/b/k", "req1");
        assert_eq!(r.headers()[header::CONTENT_RANGE], "bytes */10");
        let up = S3Error::Upstream {
            status: 403,
            code: "AccessDenied".into(),
            message: "no <way>".into(),
        };
        assert_eq!(up.status(), StatusCode::FORBIDDEN);
        let xml = up.to_xml("/b/k&x", "r");
        assert!(xml.contains("<Code>AccessDenied</Code>"));
        assert!(xml.contains("no &lt;way&gt;"));
        assert!(xml.contains("/b/k&amp;x"));
        assert_eq!(S3Error::KeyTooLong.code(), "KeyTooLongError");
    }
}
