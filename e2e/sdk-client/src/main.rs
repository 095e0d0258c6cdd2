//! An unmodified aws-sdk-rust client for the e2e suite.
//!
//! `larder-e2e-sdk-client ENDPOINT BUCKET KEY [RANGE...]` reads the object (or each `Range`
//! header value given, e.g. `bytes=0-99`) and prints `<sha256-hex> <length>` per read.
//! `larder-e2e-sdk-client ENDPOINT BUCKET KEY --put FILE` uploads FILE as a stream (the SDK then
//! sends an `aws-chunked` body with a trailing checksum) and prints the ETag.
//! Credentials come from the standard AWS environment variables.

use anyhow::Context;
use aws_sdk_s3::config::{BehaviorVersion, Region};
use sha2::{Digest, Sha256};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [endpoint, bucket, key, ranges @ ..] = args.as_slice() else {
        anyhow::bail!("usage: larder-e2e-sdk-client ENDPOINT BUCKET KEY [RANGE...]");
    };
    let shared = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .load()
        .await;
    let config = aws_sdk_s3::config::Builder::from(&shared)
        .endpoint_url(endpoint)
        .force_path_style(true)
        .build();
    let client = aws_sdk_s3::Client::from_conf(config);
    if let [flag, file] = ranges {
        if flag == "--put" {
            let body = aws_sdk_s3::primitives::ByteStream::from_path(file)
                .await
                .with_context(|| format!("opening {file}"))?;
            let out = client
                .put_object()
                .bucket(bucket)
                .key(key)
                .body(body)
                .send()
                .await
                .with_context(|| format!("PUT {bucket}/{key}"))?;
            println!("{}", out.e_tag().unwrap_or_default());
            return Ok(());
        }
    }
    let reads: Vec<Option<&String>> = if ranges.is_empty() {
        vec![None]
    } else {
        ranges.iter().map(Some).collect()
    };
    for range in reads {
        let out = client
            .get_object()
            .bucket(bucket)
            .key(key)
            .set_range(range.cloned())
            .send()
            .await
            .with_context(|| format!("GET {bucket}/{key} {range:?}"))?;
        let body = out
            .body
            .collect()
            .await
            .context("reading the body")?
            .into_bytes();
        println!("{} {}", hex::encode(Sha256::digest(&body)), body.len());
    }
    Ok(())
}
