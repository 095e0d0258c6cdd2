//! Browser-form uploads (POST Object): the `multipart/form-data` body's fields, read up to the
//! file, which S3 requires to be the last field. Only this head is parsed and held (at most
//! [`MAX_HEAD`] bytes); the file's bytes stream on untouched.

use super::S3Error;

/// Most bytes of form fields before the file (S3 caps the policy document at 20 KB).
pub const MAX_HEAD: usize = 64 * 1024;

/// The fields of a form before its file, and where the file's bytes start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormHead {
    /// Field names lowercased (S3 matches them case-insensitively), in order, with their values.
    pub fields: Vec<(String, String)>,
    /// The file's name, as the browser sent it (replaces `${filename}` in the key).
    pub file_name: String,
    /// The file part's own `Content-Type`, if any.
    pub file_content_type: Option<String>,
    /// Bytes of the body before the file's first byte.
    pub file_offset: usize,
}

impl FormHead {
    /// The value of field `name` (lowercase).
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn malformed(why: &str) -> S3Error {
    S3Error::MalformedPostRequest(format!(
        "The body of your POST request is not well-formed multipart/form-data: {why}"
    ))
}

/// The boundary of a `multipart/form-data` content type, if that is what it is.
pub fn boundary(content_type: &str) -> Option<String> {
    let mut parts = content_type.split(';');
    if !parts
        .next()?
        .trim()
        .eq_ignore_ascii_case("multipart/form-data")
    {
        return None;
    }
    parts.find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_owned())
            .filter(|b| !b.is_empty() && b.len() <= 70)
    })
}

/// Parse the fields of `body` (its first bytes) up to the file. `Ok(None)`: more bytes are
/// needed; a head longer than [`MAX_HEAD`] is refused.
pub fn parse_head(body: &[u8], boundary: &str) -> Result<Option<FormHead>, S3Error> {
    let delimiter = format!("--{boundary}");
    let mut fields = Vec::new();
    let mut at = match find(body, delimiter.as_bytes(), 0) {
        Some(0) => delimiter.len(),
        Some(_) => return Err(malformed("it does not start with the boundary")),
        None if body.len() >= MAX_HEAD => return Err(malformed("no boundary")),
        None => return Ok(None),
    };
    loop {
        // After a delimiter: CRLF and a part, or `--` (the end, with no file).
        if body.len() < at + 2 {
            return need(body);
        }
        if &body[at..at + 2] == b"--" {
            return Err(S3Error::InvalidArgument(
                "POST requires exactly one file upload per request.".into(),
            ));
        }
        if &body[at..at + 2] != b"\r\n" {
            return Err(malformed("a boundary is not followed by CRLF"));
        }
        let headers_start = at + 2;
        let Some(headers_end) = find(body, b"\r\n\r\n", headers_start) else {
            return need(body);
        };
        let headers = std::str::from_utf8(&body[headers_start..headers_end])
            .map_err(|_| malformed("part headers are not UTF-8"))?;
        let (name, file_name, content_type) = part_headers(headers)?;
        let value_start = headers_end + 4;
        if name == "file" {
            return Ok(Some(FormHead {
                fields,
                file_name: file_name.unwrap_or_default(),
                file_content_type: content_type,
                file_offset: value_start,
            }));
        }
        let close = format!("\r\n{delimiter}");
        let Some(value_end) = find(body, close.as_bytes(), value_start) else {
            return need(body);
        };
        let value = std::str::from_utf8(&body[value_start..value_end])
            .map_err(|_| malformed("a field is not UTF-8"))?;
        fields.push((name, value.to_owned()));
        at = value_end + close.len();
    }
}

fn need(body: &[u8]) -> Result<Option<FormHead>, S3Error> {
    if body.len() >= MAX_HEAD {
        Err(S3Error::MaxMessageLengthExceeded)
    } else {
        Ok(None)
    }
}

/// (field name lowercased, file name, content type) of one part's headers.
fn part_headers(headers: &str) -> Result<(String, Option<String>, Option<String>), S3Error> {
    let (mut name, mut file_name, mut content_type) = (None, None, None);
    for line in headers.split("\r\n") {
        let (h, v) = line
            .split_once(':')
            .ok_or_else(|| malformed("a part header has no colon"))?;
        if h.trim().eq_ignore_ascii_case("content-disposition") {
            let mut params = v.split(';');
            if !params
                .next()
                .is_some_and(|d| d.trim().eq_ignore_ascii_case("form-data"))
            {
                return Err(malformed("a part is not form-data"));
            }
            for p in params {
                let Some((k, v)) = p.trim().split_once('=') else {
                    continue;
                };
                let v = v.trim().trim_matches('"').to_owned();
                match k.trim().to_ascii_lowercase().as_str() {
                    "name" => name = Some(v.to_ascii_lowercase()),
                    "filename" => file_name = Some(v),
                    _ => {}
                }
            }
        } else if h.trim().eq_ignore_ascii_case("content-type") {
            content_type = Some(v.trim().to_owned());
        }
    }
    let name = name.ok_or_else(|| malformed("a part has no name"))?;
    Ok((name, file_name, content_type))
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = b"--XyZ\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nuploads/${filename}\r\n--XyZ\r\nContent-Disposition: form-data; name=\"Policy\"\r\n\r\neyJ9\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a b.txt\"\r\nContent-Type: text/plain\r\n\r\nfile bytes\r\n--XyZ--\r\n";

    #[test]
    fn fields_up_to_the_file_whatever_the_cut() {
        assert_eq!(
            boundary("multipart/form-data; boundary=XyZ").as_deref(),
            Some("XyZ")
        );
        assert_eq!(boundary("text/plain; boundary=XyZ"), None);
        for cut in 0..BODY.len() {
            let got = parse_head(&BODY[..cut], "XyZ").unwrap();
            let offset = BODY.len() - "file bytes\r\n--XyZ--\r\n".len();
            match got {
                None => assert!(cut < offset, "{cut}"),
                Some(head) => {
                    assert_eq!(head.file_offset, offset);
                    assert_eq!(head.field("key"), Some("uploads/${filename}"));
                    assert_eq!(head.field("policy"), Some("eyJ9"));
                    assert_eq!(head.file_name, "a b.txt");
                    assert_eq!(head.file_content_type.as_deref(), Some("text/plain"));
                }
            }
        }
    }

    #[test]
    fn malformed_forms_are_refused() {
        for body in [
            &b"garbage--XyZ\r\n"[..],
            b"--XyZ\r\nContent-Disposition: form-data\r\n\r\nx\r\n--XyZ--",
            b"--XyZ\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nk\r\n--XyZ--\r\n",
        ] {
            assert!(parse_head(body, "XyZ").is_err(), "{body:?}");
        }
        let huge = vec![b'a'; MAX_HEAD + 1];
        assert!(parse_head(&huge, "XyZ").is_err());
    }
}
