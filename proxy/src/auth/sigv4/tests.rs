//! Test vectors from the Amazon S3 API reference ("Signature Calculations for the Authorization
//! Header", "Query String Authentication", "Transferring Payload in Multiple Chunks").

use super::*;

const AK: &str = "AKIAIOSFODNN7EXAMPLE";
const SK: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

fn keys() -> KeyStore {
    KeyStore::from_pairs([(AK, SK)])
}

fn at(s: &str) -> SystemTime {
    parse_amz_date(s).unwrap()
}

fn get_object(signature: &str) -> Parts {
    http::Request::get("/test.txt")
        .header("host", "examplebucket.s3.amazonaws.com")
        .header("range", "bytes=0-9")
        .header("x-amz-content-sha256", EMPTY_SHA256)
        .header("x-amz-date", "20130524T000000Z")
        .header(
            "authorization",
            format!("AWS4-HMAC-SHA256 Credential={AK}/20130524/us-east-1/s3/aws4_request,SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,Signature={signature}"),
        )
        .body(())
        .unwrap()
        .into_parts()
        .0
}

const GET_SIG: &str = "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41";

#[test]
fn dates_parse() {
    assert_eq!(
        at("20130524T000000Z"),
        UNIX_EPOCH + Duration::from_secs(1_369_353_600)
    );
    assert_eq!(
        at("20000301T010203Z"),
        UNIX_EPOCH + Duration::from_secs(951_872_523)
    );
    for bad in [
        "2013052T000000Z",
        "20131324T000000Z",
        "20130524 000000Z",
        "2013O524T000000Z",
    ] {
        assert!(parse_amz_date(bad).is_none(), "{bad}");
    }
}

#[test]
fn header_signature_from_the_aws_example_verifies() {
    let v = verify(&get_object(GET_SIG), &keys(), at("20130524T000500Z")).unwrap();
    assert_eq!(v.access_key, AK);
    assert!(matches!(v.payload, Payload::Sha256(ref h) if h == EMPTY_SHA256));
}

#[test]
fn header_signature_failures_have_s3_codes() {
    let now = at("20130524T000000Z");
    let mut wrong = GET_SIG.to_owned();
    wrong.replace_range(0..1, "0");
    assert_eq!(
        verify(&get_object(&wrong), &keys(), now).unwrap_err(),
        S3Error::SignatureDoesNotMatch
    );
    let other_secret = KeyStore::from_pairs([(AK, "not-the-secret")]);
    assert_eq!(
        verify(&get_object(GET_SIG), &other_secret, now).unwrap_err(),
        S3Error::SignatureDoesNotMatch
    );
    let unknown = KeyStore::from_pairs([("SOMEONE", SK)]);
    assert_eq!(
        verify(&get_object(GET_SIG), &unknown, now).unwrap_err(),
        S3Error::InvalidAccessKeyId
    );
    assert_eq!(
        verify(&get_object(GET_SIG), &keys(), at("20130524T001600Z")).unwrap_err(),
        S3Error::RequestTimeTooSkewed
    );
    // A tampered signed header.
    let mut parts = get_object(GET_SIG);
    parts
        .headers
        .insert("range", http::HeaderValue::from_static("bytes=0-99"));
    assert_eq!(
        verify(&parts, &keys(), now).unwrap_err(),
        S3Error::SignatureDoesNotMatch
    );
    // Unsigned.
    let mut parts = get_object(GET_SIG);
    parts.headers.remove("authorization");
    assert_eq!(
        verify(&parts, &keys(), now).unwrap_err().code(),
        "AccessDenied"
    );
    // Malformed headers.
    for bad in [
        "AWS4-HMAC-SHA256 Credential=x",
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/ec2/aws4_request,SignedHeaders=host,Signature=00",
        "AWS4-HMAC-SHA512 Credential=a/b/c/s3/aws4_request,SignedHeaders=host,Signature=00",
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,SignedHeaders=range,Signature=00",
    ] {
        let mut parts = get_object(GET_SIG);
        parts
            .headers
            .insert("authorization", http::HeaderValue::from_static(bad));
        assert_eq!(
            verify(&parts, &keys(), now).unwrap_err().code(),
            "AuthorizationHeaderMalformed",
            "{bad}"
        );
    }
    let mut parts = get_object(GET_SIG);
    parts.headers.insert(
        "authorization",
        http::HeaderValue::from_static("AWS AKIAIOSFODNN7EXAMPLE:frJIUN8DYpKDtOLCwo//yllqDzg="),
    );
    assert_eq!(
        verify(&parts, &keys(), now).unwrap_err().code(),
        "AccessDenied"
    );
}

const PRESIGNED: &str = "/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404";

fn presigned(uri: &str) -> Parts {
    http::Request::get(uri)
        .header("host", "examplebucket.s3.amazonaws.com")
        .body(())
        .unwrap()
        .into_parts()
        .0
}

#[test]
fn presigned_url_from_the_aws_example_verifies_until_it_expires() {
    let v = verify(&presigned(PRESIGNED), &keys(), at("20130524T120000Z")).unwrap();
    assert!(matches!(v.payload, Payload::Unsigned));
    assert_eq!(
        verify(&presigned(PRESIGNED), &keys(), at("20130525T000001Z"))
            .unwrap_err()
            .to_string(),
        "Request has expired"
    );
    assert_eq!(
        verify(&presigned(PRESIGNED), &keys(), at("20130523T000000Z"))
            .unwrap_err()
            .to_string(),
        "Request is not valid yet"
    );
    let tampered = PRESIGNED.replace("test.txt", "other.txt");
    assert_eq!(
        verify(&presigned(&tampered), &keys(), at("20130524T000000Z")).unwrap_err(),
        S3Error::SignatureDoesNotMatch
    );
    let extra = PRESIGNED.replace("?", "?versionId=2&");
    assert_eq!(
        verify(&presigned(&extra), &keys(), at("20130524T000000Z")).unwrap_err(),
        S3Error::SignatureDoesNotMatch
    );
    for bad in [
        PRESIGNED.replace("X-Amz-Expires=86400", "X-Amz-Expires=604801"),
        PRESIGNED.replace("&X-Amz-Date=20130524T000000Z", ""),
        PRESIGNED.replace("AWS4-HMAC-SHA256", "AWS4-ECDSA-P256-SHA256"),
        format!("{PRESIGNED}&X-Amz-Expires=1"),
    ] {
        assert_eq!(
            verify(&presigned(&bad), &keys(), at("20130524T000000Z"))
                .unwrap_err()
                .code(),
            "AuthorizationQueryParametersError",
            "{bad}"
        );
    }
}

#[test]
fn streaming_chunk_signatures_from_the_aws_example_chain() {
    let seed = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9";
    let parts = http::Request::put("/examplebucket/chunkObject.txt")
        .header("host", "s3.amazonaws.com")
        .header("x-amz-date", "20130524T000000Z")
        .header("x-amz-storage-class", "REDUCED_REDUNDANCY")
        .header("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
        .header("content-encoding", "aws-chunked")
        .header("x-amz-decoded-content-length", "66560")
        .header("content-length", "66824")
        .header(
            "authorization",
            format!("AWS4-HMAC-SHA256 Credential={AK}/20130524/us-east-1/s3/aws4_request,SignedHeaders=content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length;x-amz-storage-class,Signature={seed}"),
        )
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let v = verify(&parts, &keys(), at("20130524T000000Z")).unwrap();
    let Payload::SignedChunks {
        trailer: false,
        signer: Some(mut signer),
    } = v.payload
    else {
        panic!("{:?}", v.payload)
    };
    let hash = |data: &[u8]| {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(data))
    };
    let mut broken = signer.clone();
    assert!(signer.verify_chunk(
        &hash(&[b'a'; 65536]),
        "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648"
    ));
    assert!(signer.verify_chunk(
        &hash(&[b'a'; 1024]),
        "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497"
    ));
    assert!(signer.verify_chunk(
        EMPTY_SHA256,
        "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9"
    ));
    assert!(!broken.verify_chunk(
        &hash(&[b'b'; 65536]),
        "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648"
    ));
}

#[test]
fn paths_are_tried_as_sent_and_as_s3_canonicalises_them() {
    assert_eq!(candidate_paths("/b/k~1.txt"), vec!["/b/k~1.txt"]);
    assert_eq!(
        candidate_paths("/b/a(1)%7e"),
        vec!["/b/a(1)%7e", "/b/a%281%29~"]
    );
}
