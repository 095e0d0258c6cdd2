//! `larder warm`: start a warm-up job through the admin API (or, from an access profile, one job
//! per bucket in turn), show its progress, and exit 0 only if every object was warmed.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{Progress, State, WarmRequest};

/// Flags for `larder warm`.
#[derive(Debug, clap::Args)]
pub struct WarmArgs {
    /// What to warm: `s3://bucket/prefix` (every object whose key starts with it; `s3://bucket`
    /// for the whole bucket), or one key with --exact or --range.
    #[arg(required_unless_present = "profile", conflicts_with = "profile")]
    pub target: Option<String>,
    /// Larder's admin listener.
    #[arg(long, default_value = "http://127.0.0.1:9001")]
    pub admin: String,
    /// Warm only this byte range of each object, e.g. `bytes=-65536` (a Parquet footer) or
    /// `bytes=0-8388607`; implies a single key.
    #[arg(long)]
    pub range: Option<String>,
    /// Treat the target as one key, not a prefix.
    #[arg(long)]
    pub exact: bool,
    /// Warm what an access profile recorded instead of a target: the file `GET /profile` (or
    /// `DELETE /profile`) on the admin listener answered with. The byte ranges each object was
    /// read in are warmed, bucket by bucket, one job after another.
    #[arg(long, conflicts_with_all = ["range", "exact"])]
    pub profile: Option<std::path::PathBuf>,
    /// File holding the admin bearer token (the server's `admin_token_file`); the environment
    /// variable `LARDER_ADMIN_TOKEN` may hold the token itself instead.
    #[arg(long)]
    pub admin_token_file: Option<std::path::PathBuf>,
}

/// Why the command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The target is not an `s3://` URL.
    #[error("{0:?} is not s3://bucket[/key-or-prefix]")]
    Target(String),
    /// The admin API could not be reached or answered with an error.
    #[error("admin API: {0}")]
    Admin(String),
    /// The profile could not be read, or holds nothing to warm.
    #[error("profile {0}")]
    Profile(String),
}

/// What `--profile` reads of the file: the requests `GET /profile` listed (the rest of what it
/// answered, the recording's counts, is not needed here).
#[derive(serde::Deserialize)]
struct Saved {
    warm: Vec<WarmRequest>,
}

impl WarmArgs {
    /// The jobs to run, in turn.
    fn requests(&self) -> Result<Vec<WarmRequest>, CliError> {
        let Some(path) = &self.profile else {
            return Ok(vec![self.request()?]);
        };
        let shown = path.display();
        let text = std::fs::read(path).map_err(|e| CliError::Profile(format!("{shown}: {e}")))?;
        let saved: Saved = serde_json::from_slice(&text)
            .map_err(|e| CliError::Profile(format!("{shown}: not a profile: {e}")))?;
        // A profile that recorded nothing (a filter that matched no key, a recording never
        // started) is a mistake worth an error, not a warm-up that quietly does nothing.
        if saved.warm.is_empty() {
            return Err(CliError::Profile(format!(
                "{shown} holds no reads: nothing to warm"
            )));
        }
        Ok(saved.warm)
    }

    fn request(&self) -> Result<WarmRequest, CliError> {
        let target = self.target.clone().unwrap_or_default();
        let rest = target
            .strip_prefix("s3://")
            .ok_or_else(|| CliError::Target(target.clone()))?;
        let (bucket, path) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(CliError::Target(target.clone()));
        }
        let single = self.exact || self.range.is_some();
        if single && path.is_empty() {
            return Err(CliError::Target(target.clone()));
        }
        Ok(WarmRequest {
            bucket: bucket.to_owned(),
            keys: if single {
                vec![path.to_owned()]
            } else {
                vec![]
            },
            prefix: (!single).then(|| path.to_owned()),
            range: self.range.clone(),
            objects: vec![],
        })
    }
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// The admin token to present, if one is given.
fn token(args: &WarmArgs) -> Result<Option<String>, CliError> {
    if let Some(path) = &args.admin_token_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CliError::Admin(format!("reading {}: {e}", path.display())))?;
        return Ok(Some(text.trim().to_owned()));
    }
    Ok(std::env::var("LARDER_ADMIN_TOKEN")
        .ok()
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty()))
}

async fn call(
    client: &HttpClient,
    token: Option<&str>,
    method: http::Method,
    url: &str,
    body: Option<Vec<u8>>,
) -> Result<Progress, CliError> {
    let mut request = http::Request::builder()
        .method(method)
        .uri(url)
        .header(http::header::CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| CliError::Admin(e.to_string()))?;
    let response = client
        .request(request)
        .await
        .map_err(|e| CliError::Admin(format!("{url}: {e}")))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| CliError::Admin(e.to_string()))?
        .to_bytes();
    if !status.is_success() {
        return Err(CliError::Admin(format!(
            "{status}: {}",
            String::from_utf8_lossy(&body)
        )));
    }
    serde_json::from_slice(&body).map_err(|e| CliError::Admin(format!("unexpected answer: {e}")))
}

fn human(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut i) = (bytes, 0);
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", UNITS[i])
}

fn line(p: &Progress) -> String {
    const WIDTH: usize = 30;
    let filled = ((p.percent / 100.0) * WIDTH as f64).round() as usize;
    format!(
        "[{}{}] {:5.1}% {}/{}{} objects, {} of {}, {}/s, {} errors",
        "#".repeat(filled.min(WIDTH)),
        "-".repeat(WIDTH - filled.min(WIDTH)),
        p.percent,
        p.objects_done,
        p.objects_total,
        if p.listing_done { "" } else { "+" },
        human(p.bytes_done as f64),
        human(p.bytes_total as f64),
        human(p.rate_bytes_per_second),
        p.errors
    )
}

/// Run the command; the exit code is 0 when every job finished with no errors.
pub async fn run(args: WarmArgs) -> Result<i32, CliError> {
    let requests = args.requests()?;
    let token = token(&args)?;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let base = args.admin.trim_end_matches('/');
    let mut ok = true;
    for request in &requests {
        match follow(&client, token.as_deref(), base, request).await? {
            Some(done) => ok &= done,
            None => return Ok(130),
        }
    }
    Ok(if ok { 0 } else { 1 })
}

/// Start one job and show its progress until it ends: whether it warmed every object, or
/// `None` if interrupted (the job is then cancelled).
async fn follow(
    client: &HttpClient,
    token: Option<&str>,
    base: &str,
    request: &WarmRequest,
) -> Result<Option<bool>, CliError> {
    let body = serde_json::to_vec(request).map_err(|e| CliError::Admin(e.to_string()))?;
    let started = call(
        client,
        token,
        http::Method::POST,
        &format!("{base}/warm"),
        Some(body),
    )
    .await?;
    let url = format!("{base}/warm/{}", started.id);
    eprintln!("warm-up job {} started", started.id);
    let tty = std::io::stderr().is_terminal();
    let mut last_print = std::time::Instant::now();
    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(interrupt);
    let progress = loop {
        tokio::select! {
            _ = &mut interrupt => {
                let p = call(client, token, http::Method::DELETE, &url, None).await?;
                eprintln!("\ninterrupted: job {} cancelled", p.id);
                return Ok(None);
            }
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        let p = call(client, token, http::Method::GET, &url, None).await?;
        if tty {
            eprint!("\r{}", line(&p));
            let _ = std::io::stderr().flush();
        } else if last_print.elapsed() >= Duration::from_secs(2) {
            eprintln!("{}", line(&p));
            last_print = std::time::Instant::now();
        }
        if p.state != State::Running {
            break p;
        }
    };
    if tty {
        eprintln!();
    }
    eprintln!("{}", line(&progress));
    let ok = progress.state == State::Done && progress.errors == 0;
    eprintln!(
        "job {} {:?} in {:.1}s: {} fetched from upstream, {} already cached{}",
        progress.id,
        progress.state,
        progress.elapsed_seconds,
        human(progress.bytes_fetched as f64),
        human((progress.bytes_done - progress.bytes_fetched.min(progress.bytes_done)) as f64),
        match &progress.last_error {
            Some(e) if !ok => format!("; last error: {e}"),
            _ => String::new(),
        }
    );
    Ok(Some(ok))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(target: &str, range: Option<&str>, exact: bool) -> WarmArgs {
        WarmArgs {
            target: Some(target.into()),
            admin: "http://x".into(),
            range: range.map(str::to_owned),
            admin_token_file: None,
            exact,
            profile: None,
        }
    }

    #[test]
    fn targets() {
        let r = args("s3://lake/tables/2026/", None, false)
            .request()
            .unwrap();
        assert_eq!(
            (r.bucket.as_str(), r.prefix.as_deref()),
            ("lake", Some("tables/2026/"))
        );
        let r = args("s3://lake", None, false).request().unwrap();
        assert_eq!(r.prefix.as_deref(), Some(""));
        let r = args("s3://lake/a.parquet", Some("bytes=-65536"), false)
            .request()
            .unwrap();
        assert_eq!((r.keys, r.prefix), (vec!["a.parquet".to_owned()], None));
        let r = args("s3://lake/a.parquet", None, true).request().unwrap();
        assert_eq!(r.keys, ["a.parquet"]);
        for bad in ["lake/a", "s3:///a", "https://lake/a"] {
            assert!(args(bad, None, false).request().is_err(), "{bad}");
        }
        assert!(args("s3://lake", None, true).request().is_err());
    }

    #[test]
    fn a_profile_is_its_warm_requests_and_an_empty_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.profile.json");
        let with = |text: &str| {
            std::fs::write(&path, text).unwrap();
            WarmArgs {
                profile: Some(path.clone()),
                target: None,
                ..args("s3://unused", None, false)
            }
            .requests()
        };
        let requests = with(
            r#"{"recording": false, "reads": 3, "warm": [
                {"bucket": "lake", "objects": [{"key": "a", "ranges": ["bytes=0-9"]}]},
                {"bucket": "logs", "objects": [{"key": "b"}]}]}"#,
        )
        .unwrap();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0].objects[0].ranges, ["bytes=0-9"]);
        assert!(requests[1].objects[0].ranges.is_empty());
        for bad in [r#"{"warm": []}"#, "not json", r#"{"reads": 1}"#] {
            assert!(matches!(with(bad), Err(CliError::Profile(_))), "{bad}");
        }
    }
}
