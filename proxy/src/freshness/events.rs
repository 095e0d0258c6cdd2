//! S3 event notifications: a write that bypasses Larder (straight to the bucket) reaches it as
//! an event, and what was cached of the object is dropped at once instead of being trusted for
//! the rest of `metadata_ttl`.
//!
//! Three shapes are read:
//! - the S3 event message (`Records[].s3.bucket.name`, `.object.key` URL-encoded,
//!   `.object.eTag`, `.object.versionId`), as S3 sends it to SQS or SNS and as MinIO's webhook
//!   target POSTs it;
//! - an SNS notification wrapping one (`"Type": "Notification"`, the event in `Message`), and
//!   SNS's request to confirm a subscription (`"Type": "SubscriptionConfirmation"`, handled by
//!   [`super::sns`]);
//! - an EventBridge event (`"source": "aws.s3"`, `detail-type` `Object Created` or `Object
//!   Deleted`), as an EventBridge rule delivers it to SQS.
//!
//! `front/admin.rs` receives them on `POST /v1/events`, [`super::sqs`] from a queue;
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

/// What a notification asks of Larder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notification {
    /// Objects changed (possibly none: S3's and MinIO's test events, tagging...).
    Changes(Vec<Change>),
    /// SNS asks that a subscription be confirmed by a GET of `subscribe_url`.
    ConfirmSubscription {
        /// The topic subscribed to.
        topic: String,
        /// The URL to GET, as SNS gave it (checked by [`super::sns`] before use).
        subscribe_url: String,
    },
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
    #[serde(rename = "SubscribeURL")]
    subscribe_url: Option<String>,
    #[serde(rename = "TopicArn", default)]
    topic: String,
    /// An EventBridge event: `aws.s3`, its kind, and what it is about.
    source: Option<String>,
    #[serde(rename = "detail-type")]
    detail_type: Option<String>,
    time: Option<String>,
    detail: Option<Detail>,
}

/// The `detail` of an EventBridge event from S3.
#[derive(Deserialize)]
struct Detail {
    bucket: Bucket,
    object: BridgeObject,
}

#[derive(Deserialize)]
struct BridgeObject {
    key: String,
    etag: Option<String>,
    #[serde(rename = "version-id")]
    version_id: Option<String>,
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

/// What a notification body asks: the changes it reports (events other than object creation
/// and removal, like tagging, restores or replication, change no bytes and are left out), or
/// an SNS subscription to confirm.
pub fn parse(body: &[u8]) -> Result<Notification, EventError> {
    let mut message: Message = serde_json::from_slice(body)?;
    match message.sns_type.as_deref() {
        Some("Notification") => {
            if let Some(inner) = message.sns_message.take() {
                message = serde_json::from_str(&inner)?;
            }
        }
        Some("SubscriptionConfirmation") => {
            if let Some(subscribe_url) = message.subscribe_url {
                return Ok(Notification::ConfirmSubscription {
                    topic: message.topic,
                    subscribe_url,
                });
            }
        }
        _ => {}
    }
    if message.source.as_deref() == Some("aws.s3") {
        let (Some(kind), Some(detail)) = (message.detail_type, message.detail) else {
            return Ok(Notification::Changes(Vec::new()));
        };
        return Ok(Notification::Changes(bridged(&kind, detail, message.time)));
    }
    Ok(Notification::Changes(
        message.records.into_iter().filter_map(change).collect(),
    ))
}

fn change(record: Record) -> Option<Change> {
    let name = record.event_name.trim_start_matches("s3:");
    let kind = if name.starts_with("ObjectCreated:") {
        ChangeKind::created(record.s3.object.etag)
    } else if name.starts_with("ObjectRemoved:") {
        ChangeKind::Removed
    } else {
        return None;
    };
    // Keys are URL-encoded the way HTML forms are: `+` is a space.
    let key = form_decoded(&record.s3.object.key)?;
    Some(Change {
        object: object(record.s3.bucket.name, key, record.s3.object.version_id),
        kind,
        at: record.event_time.as_deref().and_then(rfc3339),
    })
}

/// An EventBridge event's changes. Whether its keys are URL-encoded is not stated anywhere
/// Larder can rely on, so a key that decodes differently is dropped under both spellings:
/// dropping one key too many costs a fetch, one too few would serve stale bytes.
fn bridged(kind: &str, detail: Detail, time: Option<String>) -> Vec<Change> {
    let kind = match kind {
        "Object Created" => ChangeKind::created(detail.object.etag),
        "Object Deleted" => ChangeKind::Removed,
        _ => return Vec::new(),
    };
    let at = time.as_deref().and_then(rfc3339);
    let raw = detail.object.key;
    let mut keys = vec![raw.clone()];
    keys.extend(form_decoded(&raw).filter(|decoded| *decoded != raw));
    keys.into_iter()
        .map(|key| Change {
            object: object(
                detail.bucket.name.clone(),
                key,
                detail.object.version_id.clone(),
            ),
            kind: kind.clone(),
            at,
        })
        .collect()
}

impl ChangeKind {
    fn created(etag: Option<String>) -> Self {
        let etag = etag.filter(|e| !e.is_empty());
        ChangeKind::Created(etag.map(|e| e.trim_matches('"').to_owned()))
    }
}

fn form_decoded(key: &str) -> Option<String> {
    form_urlencoded::parse(format!("k={key}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
}

fn object(bucket: String, key: String, version_id: Option<String>) -> ObjectId {
    ObjectId {
        bucket: bucket.into(),
        key: key.into(),
        version_id: version_id
            .filter(|v| !v.is_empty() && v != "null")
            .map(Into::into),
    }
}

fn rfc3339(time: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(time).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIO: &str = r#"{"EventName":"s3:ObjectCreated:Put","Key":"bkt/dir/a b+c.txt","Records":[{"eventVersion":"2.0","eventSource":"minio:s3","awsRegion":"","eventTime":"2026-11-24T10:08:04.856Z","eventName":"s3:ObjectCreated:Put","s3":{"s3SchemaVersion":"1.0","configurationId":"Config","bucket":{"name":"bkt","arn":"arn:aws:s3:::bkt"},"object":{"key":"dir%2Fa+b%2Bc.txt","size":5,"eTag":"5d41402abc4b2a76b9719d911017c592","sequencer":"18EAF34654B74860"}}},{"eventTime":"2026-11-24T10:08:04.872Z","eventName":"s3:ObjectRemoved:Delete","s3":{"bucket":{"name":"bkt"},"object":{"key":"gone","versionId":"v7","sequencer":"18EAF34655BDB533"}}},{"eventName":"s3:ObjectTagging:Put","s3":{"bucket":{"name":"bkt"},"object":{"key":"tagged"}}}]}"#;

    fn changes(body: &[u8]) -> Vec<Change> {
        match parse(body).unwrap() {
            Notification::Changes(changes) => changes,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn minio_webhook_events_become_changes_with_decoded_keys() {
        let changes = changes(MINIO.as_bytes());
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
        assert_eq!(changes(sns.as_bytes()).len(), 2);
        assert!(parse(b"not json").is_err());
        assert!(parse(br#"{"Records":[{"eventName":1}]}"#).is_err());
        // S3's test event on configuring a queue carries no records.
        let test = br#"{"Service":"Amazon S3","Event":"s3:TestEvent","Bucket":"b"}"#;
        assert!(changes(test).is_empty());
    }

    #[test]
    fn an_sns_subscription_asks_to_be_confirmed() {
        let body = serde_json::json!({
            "Type": "SubscriptionConfirmation",
            "TopicArn": "arn:aws:sns:us-east-1:123456789012:lake",
            "SubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&Token=t",
        });
        assert_eq!(
            parse(body.to_string().as_bytes()).unwrap(),
            Notification::ConfirmSubscription {
                topic: "arn:aws:sns:us-east-1:123456789012:lake".into(),
                subscribe_url:
                    "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&Token=t".into(),
            }
        );
    }

    #[test]
    fn eventbridge_events_become_changes_under_both_spellings_of_an_encoded_key() {
        let body = serde_json::json!({
            "version": "0", "detail-type": "Object Created", "source": "aws.s3",
            "time": "2026-11-24T10:08:04Z",
            "detail": {"version": "0", "bucket": {"name": "lake"},
                "object": {"key": "t/a+b.parquet", "etag": "abc-2", "version-id": "v1",
                    "sequencer": "00"}, "reason": "PutObject"}
        });
        let created = changes(body.to_string().as_bytes());
        let keys: Vec<&str> = created.iter().map(|c| c.object.key.as_ref()).collect();
        assert_eq!(keys, ["t/a+b.parquet", "t/a b.parquet"]);
        assert_eq!(created[0].kind, ChangeKind::Created(Some("abc-2".into())));
        assert_eq!(created[0].object.version_id.as_deref(), Some("v1"));
        assert!(created[0].at.is_some());

        let mut deleted = body.clone();
        deleted["detail-type"] = "Object Deleted".into();
        deleted["detail"]["object"]["key"] = "plain".into();
        let deleted = changes(deleted.to_string().as_bytes());
        assert_eq!(deleted.len(), 1);
        assert_eq!(deleted[0].kind, ChangeKind::Removed);

        let mut other = body;
        other["detail-type"] = "Object Tags Added".into();
        assert!(changes(other.to_string().as_bytes()).is_empty());
    }
}
