//! GetObject and HeadObject of one part of a multipart upload (`?partNumber=N`): from the
//! caches as the range the part is, once an upstream answer to a read of it said where it lies
//! (`read::parts`). A first GET of a part is Larder's own GET of it, whose answer says that and
//! whose body fills the blocks the part covers; a first HEAD passes through, and its answer is
//! learnt.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::request::Parts;
use http::{HeaderMap, Method};

use crate::auth::Principal;
use crate::model::{ObjectId, PartNumber};
use crate::s3::headers::part_span;
use crate::s3::operation::Operation;
use crate::s3::request::{ObjectQuery, Target};

use super::object::{object_id, PartRead};
use super::{AppState, Handled};

impl AppState {
    /// Part `part` of the object `req` names. Where the part lies is known from an earlier
    /// read while the object keeps the ETag and size it had then: the read is that range from
    /// the caches. Otherwise a GET is Larder's own GET of the part
    /// ([`AppState::first_read_of_part`]), and a HEAD (or a GET that cannot be read so) passes
    /// through as the client signed it (S3 reads the one part number the query holds:
    /// [`ObjectQuery::part`]), its 206 learnt.
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
        // Nothing known of the object now (written through Larder, changed by an event, or
        // forgotten): a read of the span learnt before would open it with a GET of that span,
        // wasted if the object changed. The part's own GET costs the same, and says where the
        // part lies now.
        let own_get = !head && self.blocks.opens_upload_parts();
        let reopen = own_get && self.metadata.is_unknown(&id) && !self.blocks.known_on_disk(&id);
        if let Some(span) = self.parts.get(&id, part).filter(|_| !reopen) {
            let known = PartRead {
                span: &span,
                opened: false,
            };
            match self
                .answer(
                    &req.headers,
                    &id,
                    query,
                    head,
                    Some(known),
                    principal.access_key.as_deref(),
                )
                .await
            {
                Ok(handled) => return handled,
                Err(_) => self.parts.forget(&id, part),
            }
        }
        if own_get {
            let reader = principal.access_key.as_deref();
            let first = self.first_read_of_part(&req.headers, &id, query, part, reader);
            if let Some(handled) = Box::pin(first).await {
                return handled;
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

    /// A GET of a part whose place is not known, answered from the caches after Larder's own
    /// GET of the part (`BlockStore::open_upload_part`): its answer says where the part lies
    /// (learnt) and brings the object's metadata (kept, unless the cache holds the object's
    /// already), and its body fills the blocks the part covers, which the read then joins.
    /// `None` when that GET failed or its answer could not be read so, or when the object's
    /// cached metadata is of another version: the read passes through (and an error is then
    /// S3's own answer to the client's request).
    async fn first_read_of_part(
        &self,
        headers: &HeaderMap,
        id: &ObjectId,
        query: &ObjectQuery,
        part: PartNumber,
        reader: Option<&str>,
    ) -> Option<Handled> {
        let opened = self.blocks.open_upload_part(id.clone(), part).await;
        let (meta, span) = opened.ok().flatten()?;
        self.parts.learn(id.clone(), part, span.clone());
        let known = std::future::ready(Ok(Some((meta, Duration::ZERO))));
        self.metadata.get_or_open(id, known).await.ok()?;
        let read = PartRead {
            span: &span,
            opened: true,
        };
        match self
            .answer(headers, id, query, false, Some(read), reader)
            .await
        {
            Ok(handled) => Some(handled),
            Err(_) => {
                self.parts.forget(id, part);
                None
            }
        }
    }
}
