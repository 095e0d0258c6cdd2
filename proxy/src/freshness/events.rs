//! S3 event notifications: a write that bypasses Larder (straight to the bucket) reaches it as
//! an event, and what was cached of the object is dropped at once instead of being trusted for
//! the rest of `metadata_ttl`.
//!
//! The format is the S3 event message (`Records[].s3.bucket.name`, `.object.key` URL-encoded,
//! `.object.eTag`, `.object.versionId`), as S3 sends it and as MinIO's webhook target POSTs it;
//! an SNS notification wrapping one (`"Type": "Notification"`, the event in `Message`) is
//! unwrapped. `front/admin.rs` receives them on `POST /v1/events`, [`super::sqs`] from a queue;
//! [`super::Freshness::apply`] acts on them.

use std::time::SystemTime;

use serde::Deserialize;

use crate::model::ObjectId;

/// Why a notification could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// Not JSON of the S3 event message's shape.
    #[error("not an S3 event notification: {0}")]
    Malformed(#[from] serde_json::Error),
}

/// What an event says happened to an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The object (and, in a versioned bucket, the version the event names).
    pub object: ObjectId,
    /// Created (with the new version's ETag, when the event carries one) or removed.
    pub kind: ChangeKind,
    /// When the change happened, as the event says.
    pub at: Option<SystemTime>,
}

/// Created or removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeKind {
    /// `s3:ObjectCreated:*`, with the new ETag (without quotes) if the event has it.
    Created(Option<String>),
    /// `s3:ObjectRemoved:*`.
    Removed,
}

#[derive(Deserialize)]
struct Message {
    #[serde(rename = "Records", default)]
    records: Vec<Record>,
    /// An SNS envelope: the S3 event is the `Message` string.
    #[serde(rename = "Type")]
    sns_type: Option<String>,
    #[serde(rename = "Message")]
    sns_message: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    event_name: String,
    event_time: Option<String>,
    s3: S3Entity,
}

#[derive(Deserialize)]
struct S3Entity {
    bucket: Bucket,
    object: Object,
}

#[derive(Deserialize)]
struct Bucket {
    name: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Object {
    key: String,
    #[serde(rename = "eTag")]
    etag: Option<String>,
    version_id: Option<String>,
}

/// The changes a notification body reports; events other than object creation and removal
/// (tagging, restores, replication...) change no bytes and are left out.
pub fn parse(body: &[u8]) -> Result<Vec<Change>, EventError> {
    let mut message: Message = serde_json::from_slice(body)?;
    if message.sns_type.as_deref() == Some("Notification") {
        if let Some(inner) = message.sns_message.take() {
            message = serde_json::from_str(&inner)?;
        }
    }
    Ok(message.records.into_iter().filter_map(change).collect())
}

fn change(record: Record) -> Option<Change> {
    let name = record.event_name.trim_start_matches("s3:");
    let kind = if name.starts_with("ObjectCreated:") {
        let etag = record.s3.object.etag.filter(|e| !e.is_empty());
        ChangeKind::Created(etag.map(|e| e.trim_matches('"').to_owned()))
    } else if name.starts_with("ObjectRemoved:") {
        ChangeKind::Removed
    } else {
        return None;
    };
    // Keys are URL-encoded the way HTML forms are: `+` is a space.
    let key: String = form_urlencoded::parse(format!("k={}", record.s3.object.key).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())?;
    Some(Change {
        object: ObjectId {
            bucket: record.s3.bucket.name.into(),
            key: key.into(),
            version_id: record
                .s3
                .object
                .version_id
                .filter(|v| !v.is_empty() && v != "null")
                .map(Into::into),
        },
        kind,
        at: record
            .event_time
            .and_then(|t| humantime::parse_rfc3339_weak(&t).ok()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIO: &str = r#"{"EventName":"s3:ObjectCreated:Put","Key":"bkt/dir/a b+c.txt","Records":[{"eventVersion":"2.0","eventSource":"minio:s3","awsRegion":"","eventTime":"2026-11-24T10:08:04.856Z","eventName":"s3:ObjectCreated:Put","s3":{"s3SchemaVersion":"1.0","configurationId":"Config","bucket":{"name":"bkt","arn":"arn:aws:s3:::bkt"},"object":{"key":"dir%2Fa+b%2Bc.txt","size":5,"eTag":"5d41402abc4b2a76b9719d911017c592","sequencer":"18EAF34654B74860"}}},{"eventTime":"2026-11-24T10:08:04.872Z","eventName":"s3:ObjectRemoved:Delete","s3":{"bucket":{"name":"bkt"},"object":{"key":"gone","versionId":"v7","sequencer":"18EAF34655BDB533"}}},{"eventName":"s3:ObjectTagging:Put","s3":{"bucket":{"name":"bkt"},"object":{"key":"tagged"}}}]}"#;

    #[test]
    fn minio_webhook_events_become_changes_with_decoded_keys() {
        let changes = parse(MINIO.as_bytes()).unwrap();
        assert_eq!(changes.len(), 2, "tagging changes no bytes");
        assert_eq!(changes[0].object.bucket.as_ref(), "bkt");
        assert_eq!(changes[0].object.key.as_ref(), "dir/a b+c.txt");
        assert_eq!(
            changes[0].kind,
            ChangeKind::Created(Some("5d41402abc4b2a76b9719d911017c592".into()))
        );
        assert!(changes[0].at.is_some());
        assert_eq!(changes[1].kind, ChangeKind::Removed);
        assert_eq!(changes[1].object.version_id.as_deref(), Some("v7"));
    }

    #[test]
    fn an_sns_notification_is_unwrapped_and_garbage_is_refused() {
        let sns = serde_json::json!({"Type": "Notification", "Message": MINIO}).to_string();
        assert_eq!(parse(sns.as_bytes()).unwrap().len(), 2);
        assert!(parse(b"not json").is_err());
        assert!(parse(br#"{"Records":[{"eventName":1}]}"#).is_err());
    }
}
