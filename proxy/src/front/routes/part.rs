//! GetObject and HeadObject of one part of a multipart upload (`?partNumber=N`): from the
//! caches as the range the part is, once the upstream's answer to a read of it said where it
//! lies (`read::parts`); passed through, and that answer learnt, until then.

use std::sync::Arc;

use axum::body::Body;
use http::request::Parts;
use http::Method;

use crate::auth::Principal;
use crate::model::PartNumber;
use crate::s3::headers::part_span;
use crate::s3::operation::Operation;
use crate::s3::request::{ObjectQuery, Target};

use super::object::object_id;
use super::{AppState, Handled};

impl AppState {
    /// Part `part` of the object `req` names. A first read passes through as the client signed
    /// it (S3 reads the one part number the query holds: [`ObjectQuery::part`]); its 206 says
    /// where the part lies, in the object of that ETag and size. Later reads, while the object
    /// still has them, are that range from the caches; otherwise they pass through again.
    // The pass-through's arguments, and the part.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn object_part(
        &self,
        req: Parts,
        body: Body,
        bucket: Arc<str>,
        key: Arc<str>,
        query: &ObjectQuery,
        part: PartNumber,
        principal: Principal,
        operation: Operation,
    ) -> Handled {
        let id = object_id(bucket.clone(), key.clone(), query);
        let head = req.method == Method::HEAD;
        if let Some(span) = self.parts.get(&id, part) {
            match self
                .answer(&req.headers, &id, query, head, Some(&span))
                .await
            {
                Ok(handled) => return handled,
                Err(_) => self.parts.forget(&id, part),
            }
        }
        let target = Target::Object { bucket, key };
        let answer = self
            .pass_through(req, body, target, principal, None, operation)
            .await;
        if let Ok((response, _)) = &answer {
            if let Some(span) = part_span(response.status(), response.headers()) {
                self.parts.learn(id, part, span);
            }
        }
        answer
    }
}
