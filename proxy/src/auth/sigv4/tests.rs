//! Test vectors from the Amazon S3 API reference ("Signature Calculations for the Authorization
//! Header", "Query String Authentication", "Transferring Payload in Multiple Chunks").

use super::*;

const AK: &str = "AKIAIOSFODNN7EXAMPLE";
const SK: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

/// Verify as the authenticator does, with the request's own query parsed.
fn verify(parts: &Parts, keys: &KeyStore, now: SystemTime) -> Result<Verified, S3Error> {
    super::verify(parts, &Query::parse(parts.uri.query()), keys, now)
}

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
        // Read as 86400 by a lenient parse, but not what a signer writes: the signature covers
        // the text, and the text must be the number Larder acts on.
        PRESIGNED.replace("X-Amz-Expires=86400", "X-Amz-Expires=%2B86400"),
        PRESIGNED.replace("X-Amz-Expires=86400", "X-Amz-Expires=086400"),
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
    let paths = |raw| candidate_paths(raw).collect::<Vec<_>>();
    assert_eq!(paths("/b/k~1.txt"), vec!["/b/k~1.txt"]);
    assert_eq!(paths("/b/a(1)%7e"), vec!["/b/a(1)%7e", "/b/a%281%29~"]);
    // Already canonical, though not plain: tried once.
    assert_eq!(paths("/b/a%20b"), vec!["/b/a%20b"]);
}

/// The AWS SDK's signer (`aws-sigv4`), as a client would run it: the reference the verifier's
/// own canonical request must agree with.
mod sdk {
    use std::time::SystemTime;

    use aws_credential_types::Credentials;
    use aws_sigv4::http_request::{
        sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest,
        SignatureLocation, SigningInstructions, SigningSettings, UriPathNormalizationMode,
    };
    use aws_sigv4::sign::v4;
    use aws_smithy_runtime_api::client::identity::Identity;

    /// What a client sending `uri` with `headers` (name and value; `host` among them) adds
    /// to its request: headers (`authorization`, `x-amz-date`...) or query parameters.
    pub(super) fn sign_request(
        method: &str,
        uri: &str,
        headers: &[(String, String)],
        presigned: Option<u64>,
        time: SystemTime,
        region: &str,
    ) -> SigningInstructions {
        let identity: Identity = Credentials::new(super::AK, super::SK, None, None, "test").into();
        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        settings.excluded_headers = Some(Vec::new());
        let body = match presigned {
            Some(expires) => {
                settings.signature_location = SignatureLocation::QueryParams;
                settings.expires_in = Some(std::time::Duration::from_secs(expires));
                settings.payload_checksum_kind = PayloadChecksumKind::NoHeader;
                SignableBody::UnsignedPayload
            }
            None => {
                settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
                SignableBody::Precomputed(super::EMPTY_SHA256.to_owned())
            }
        };
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(region)
            .name("s3")
            .time(time)
            .settings(settings)
            .build()
            .unwrap()
            .into();
        let request = SignableRequest::new(
            method,
            uri,
            headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            body,
        )
        .unwrap();
        sign(request, &params).unwrap().into_parts().0
    }
}

mod agrees_with_the_sdk {
    use proptest::prelude::*;

    use super::*;

    /// One request, as a client builds it before signing.
    #[derive(Debug, Clone)]
    struct Case {
        method: &'static str,
        /// The path as sent (already a valid URI path).
        path: String,
        /// Whether the client signs the path as S3 canonicalises it rather than as sent.
        sign_canonical_path: bool,
        query: Vec<(String, String)>,
        /// Encode spaces in the query as `+` rather than `%20`.
        plus_for_space: bool,
        /// Header names (distinct, lowercase) and their values; several values per name.
        headers: Vec<(String, Vec<String>)>,
        region: String,
        /// Seconds after 2013-05-24T00:00:00Z.
        offset: u64,
        presigned: Option<u64>,
    }

    fn text(chars: &'static str, max: usize) -> impl Strategy<Value = String> {
        proptest::collection::vec(
            proptest::sample::select(chars.chars().collect::<Vec<_>>()),
            0..max,
        )
        .prop_map(|c| c.into_iter().collect())
    }

    const PATH: &str = "abcXYZ019-._~!$&'()*+,;=:@/%";
    const QUERY: &str = "abcXYZ09-._~ !$'()*,/:;=?@[]%+&€é";
    const VALUE: &str = "abcXYZ09-._~ \t!\"#$%&'()*+,/:;<=>?@[\\]^`{|}";

    fn case() -> impl Strategy<Value = Case> {
        let header_name = "(x-amz-meta-[a-z0-9]{1,6}|content-type|range|if-match|x-amz-[a-z]{1,8})";
        (
            proptest::sample::select(vec!["GET", "HEAD", "PUT", "DELETE", "POST"]),
            proptest::collection::vec(text(PATH, 8), 1..4),
            any::<bool>(),
            proptest::collection::vec((text(QUERY, 6), text(QUERY, 6)), 0..5),
            any::<bool>(),
            proptest::collection::btree_map(
                header_name,
                proptest::collection::vec(text(VALUE, 12), 1..3),
                0..4,
            ),
            "[a-z]{2}-[a-z]{4,9}-[0-9]",
            0u64..3 * 86_400,
            proptest::option::of(1u64..=604_800),
        )
            .prop_map(
                |(
                    method,
                    segments,
                    sign_canonical_path,
                    query,
                    plus_for_space,
                    headers,
                    region,
                    offset,
                    presigned,
                )| {
                    // A `%` in a path segment starts an escape of two hex digits, as a valid
                    // URI's would.
                    let path = segments
                        .iter()
                        .map(|s| s.replace('%', "%4a"))
                        .collect::<Vec<_>>()
                        .join("/");
                    let headers = headers
                        .into_iter()
                        .filter(|(name, _)| {
                            !matches!(
                                name.as_str(),
                                "x-amz-date"
                                    | "x-amz-content-sha256"
                                    | "x-amz-user-agent"
                                    | "x-amz-checksum-mode"
                                    | "x-amz-security-token"
                            )
                        })
                        .collect();
                    Case {
                        method,
                        path: format!("/{path}"),
                        sign_canonical_path,
                        query,
                        plus_for_space,
                        headers,
                        region,
                        offset,
                        presigned,
                    }
                },
            )
    }

    fn encode_query(pairs: &[(String, String)], plus_for_space: bool) -> String {
        if plus_for_space {
            form_urlencoded::Serializer::new(String::new())
                .extend_pairs(pairs)
                .finish()
        } else {
            let encode = |s: &str| {
                percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC)
                    .to_string()
            };
            pairs
                .iter()
                .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
                .collect::<Vec<_>>()
                .join("&")
        }
    }

    fn with_query(path: &str, query: &str) -> String {
        if query.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{query}")
        }
    }

    /// The request the client sends, signed by the SDK, and the time it was signed at.
    fn signed(case: &Case) -> (http::request::Builder, SystemTime) {
        let time = at("20130524T000000Z") + Duration::from_secs(case.offset);
        let query = encode_query(&case.query, case.plus_for_space);
        let signed_path = if case.sign_canonical_path {
            let decoded = percent_encoding::percent_decode_str(&case.path).collect::<Vec<u8>>();
            crate::s3::request::encode_path(&decoded)
        } else {
            case.path.clone()
        };
        let mut headers = vec![("host".to_owned(), "bucket.example:9000".to_owned())];
        for (name, values) in &case.headers {
            for value in values {
                headers.push((name.clone(), value.clone()));
            }
        }
        let instructions = sdk::sign_request(
            case.method,
            &format!(
                "http://bucket.example:9000{}",
                with_query(&signed_path, &query)
            ),
            &headers,
            case.presigned,
            time,
            &case.region,
        );
        let mut query_sent = query;
        for (name, value) in instructions.params() {
            let pair = form_urlencoded::Serializer::new(String::new())
                .append_pair(name, value)
                .finish();
            if !query_sent.is_empty() {
                query_sent.push('&');
            }
            query_sent.push_str(&pair);
        }
        let mut request = http::Request::builder()
            .method(case.method)
            .uri(with_query(&case.path, &query_sent));
        for (name, value) in headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain(instructions.headers())
        {
            request = request.header(name, value);
        }
        (request, time)
    }

    fn parts(request: http::request::Builder) -> Parts {
        request.body(()).unwrap().into_parts().0
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Every request the SDK signs verifies, and names exactly the headers it signed.
        #[test]
        fn what_the_sdk_signs_verifies(case in case()) {
            let (request, time) = signed(&case);
            let verified = verify(&parts(request), &keys(), time + Duration::from_secs(1));
            let verified = verified.map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            let Signed::Headers(names) = &verified.signed else { panic!() };
            for (name, _) in &case.headers {
                prop_assert!(names.iter().any(|n| n == name.as_str()), "{name} not signed");
            }
        }

        /// Changing anything the SDK signed (a header value, the path, the query, the method)
        /// fails.
        #[test]
        fn what_is_changed_after_signing_fails(case in case(), which in 0usize..4) {
            let (request, time) = signed(&case);
            let mut parts = parts(request);
            match which {
                0 if !case.headers.is_empty() => {
                    let name = http::HeaderName::from_bytes(case.headers[0].0.as_bytes()).unwrap();
                    let value = format!("{}x", case.headers[0].1[0]);
                    parts.headers.insert(name, value.parse().unwrap());
                }
                1 | 0 => {
                    let pq = parts.uri.path_and_query().unwrap().as_str();
                    let changed = pq.replacen('/', "/z", 1);
                    parts.uri = changed.parse().unwrap();
                }
                2 => {
                    let pq = parts.uri.path_and_query().unwrap().as_str();
                    let changed = if pq.contains('?') { pq.replacen('?', "?zz=1&", 1) } else { format!("{pq}?zz=1") };
                    parts.uri = changed.parse().unwrap();
                }
                _ => {
                    parts.method = if case.method == "GET" { http::Method::HEAD } else { http::Method::GET };
                }
            }
            prop_assert_eq!(
                verify(&parts, &keys(), time + Duration::from_secs(1)).unwrap_err(),
                S3Error::SignatureDoesNotMatch
            );
        }
    }
}

#[test]
fn a_header_named_twice_in_signed_headers_is_refused() {
    let parts = http::Request::get("/test.txt")
        .header("host", "examplebucket.s3.amazonaws.com")
        .header("x-amz-content-sha256", EMPTY_SHA256)
        .header("x-amz-date", "20130524T000000Z")
        .header(
            "authorization",
            format!("AWS4-HMAC-SHA256 Credential={AK}/20130524/us-east-1/s3/aws4_request,SignedHeaders=host;host;x-amz-content-sha256;x-amz-date,Signature={GET_SIG}"),
        )
        .body(())
        .unwrap()
        .into_parts()
        .0;
    assert_eq!(
        verify(&parts, &keys(), at("20130524T000000Z"))
            .unwrap_err()
            .code(),
        "AuthorizationHeaderMalformed"
    );
}

#[test]
fn signatures_are_equal_only_when_every_byte_is() {
    // 64 hex digits (SigV4), 28 base64 characters (SigV2, a remainder past the last word), and
    // lengths around a word.
    for len in [0usize, 1, 7, 8, 9, 28, 64] {
        let a: Vec<u8> = (0..len as u8).map(|i| b'a' + i % 26).collect();
        assert!(equal(&a, &a.clone()), "{len}");
        for i in 0..len {
            let mut b = a.clone();
            b[i] ^= 1;
            assert!(!equal(&a, &b), "{len}: byte {i}");
        }
        assert!(!equal(&a, &[a.as_slice(), b"x"].concat()), "{len}: longer");
    }
}
