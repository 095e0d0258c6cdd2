//! A request's query string, split and decoded once for everything that reads it: the
//! authenticator (is it presigned, with which parameters, and the canonical query its signature
//! covers) and the router (sub-resources, `versionId`, `response-*` overrides).
//!
//! Why one parse: a presigned GET's query was decoded five times (twice to see which signature
//! form it carries, once to pick the signature's parameters, once more for the canonical query,
//! and by the router), a twentieth of a small hit's CPU (docs/benchmarks.md, "SigV4
//! verification"). Decoding borrows from the request wherever a parameter has nothing to
//! decode, so a typical query allocates one `Vec` and its escaped values.

use std::borrow::Cow;

/// The parameters of a query, decoded (`+` is a space, `%XX` a byte, invalid UTF-8 replaced),
/// in the order sent. A parameter without `=` has an empty value; empty pairs (`a&&b`) are
/// skipped, as S3 and the SDKs' signers skip them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query<'a> {
    params: Vec<(Cow<'a, str>, Cow<'a, str>)>,
}

impl<'a> Query<'a> {
    /// Split and decode a raw query string (`None`: no query), as `form_urlencoded::parse`
    /// does. Written out rather than calling it: that decoder scans each part three times
    /// (for `+`, for `%`, for UTF-8) where nothing needs decoding, and a presigned URL's
    /// query, parsed on every hit, took a microsecond (docs/benchmarks.md, "SigV4 and the
    /// query: what verifying costs a small hit").
    pub fn parse(raw: Option<&'a str>) -> Self {
        let raw = raw.unwrap_or("");
        let mut params = Vec::with_capacity(raw.bytes().filter(|&b| b == b'&').count() + 1);
        for pair in raw.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            params.push((decode(name), decode(value)));
        }
        Self { params }
    }

    /// Every `(name, value)`, decoded, in the order sent.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.params.iter().map(|(k, v)| (k.as_ref(), v.as_ref()))
    }

    /// Whether a parameter of this (decoded) name is present.
    pub fn contains(&self, name: &str) -> bool {
        self.params.iter().any(|(k, _)| k == name)
    }
}

/// One name or value decoded: `+` is a space, `%XX` a byte (a `%` not followed by two hex
/// digits stays), then invalid UTF-8 replaced; borrowed when there is nothing to decode. One
/// pass into one buffer of the right size.
fn decode(part: &str) -> Cow<'_, str> {
    let bytes = part.as_bytes();
    if !bytes.iter().any(|&b| b == b'%' || b == b'+') {
        return Cow::Borrowed(part);
    }
    let hex = |b: u8| char::from(b).to_digit(16);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = match bytes.get(i..i + 3) {
            Some([b'%', hi, lo]) => hex(*hi).zip(hex(*lo)),
            _ => None,
        };
        match (escape, bytes[i]) {
            (Some((hi, lo)), _) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, b) => out.push(b),
        }
        i += 1;
    }
    match String::from_utf8(out) {
        Ok(text) => Cow::Owned(text),
        Err(e) => Cow::Owned(String::from_utf8_lossy(e.as_bytes()).into_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_decoded_in_order_and_borrowed_when_plain() {
        let q = Query::parse(Some("b=2&a=x+y%2Fz&&flag&c=%E2%82%AC"));
        let pairs: Vec<_> = q.iter().collect();
        assert_eq!(
            pairs,
            [("b", "2"), ("a", "x y/z"), ("flag", ""), ("c", "€")]
        );
        assert!(matches!(q.params[0].0, Cow::Borrowed(_)));
        assert!(matches!(q.params[1].1, Cow::Owned(_)));
        assert!(q.contains("flag") && !q.contains("x"));
        assert_eq!(Query::parse(None), Query::default());
    }

    #[test]
    fn the_same_pairs_as_form_urlencoded() {
        // The parse every reader used before: one decoder, so verification and routing agree.
        for raw in [
            "",
            "&",
            "=",
            "a=1&a=2",
            "%zz=%4",
            "x=%E2%82",
            "k=v=w",
            "+=+",
            "%2B=%2b+%",
            "a%3D=%26&=x",
            "%ff%fe=%C3",
            "é=€+%E2%82%AC",
            "==&&=",
        ] {
            let (ours, theirs) = both_parses(raw);
            assert_eq!(ours, theirs, "{raw}");
        }
    }

    type Pairs = Vec<(String, String)>;

    /// `raw`'s pairs as this parser and as `form_urlencoded` give them.
    fn both_parses(raw: &str) -> (Pairs, Pairs) {
        let ours = Query::parse(Some(raw))
            .iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let theirs = form_urlencoded::parse(raw.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        (ours, theirs)
    }

    proptest::proptest! {
        /// Any query, as `form_urlencoded` (what verification and routing both read before
        /// this parser) splits and decodes it.
        #[test]
        fn any_query_parses_as_form_urlencoded_parses_it(
            raw in "[a=&%+2Bfé€ ]{0,24}"
        ) {
            let (ours, theirs) = both_parses(&raw);
            proptest::prop_assert_eq!(ours, theirs);
        }
    }
}
