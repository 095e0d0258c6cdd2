//! Configuration: defaults < TOML file (`--config`) < `LARDER_*` environment < command-line flags.
//!
//! Every option is declared once, in `options!` below: its documentation, type and default.
//! The [`Config`] struct, its `Default`, the option list and the command-line flags
//! ([`flags::Flags`]) all derive from that declaration, and a test holds `docs/configuration.md`
//! to it: every key, every flag and every default.

use std::net::SocketAddr;
use std::path::PathBuf;

use cache_core::disk::{Admission, EngineKind, Recovery};
use cache_core::WritePolicy;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::auth::{AuthMode, KeyPolicy};
use crate::fleet::ring::Scope;
use crate::freshness::sns::SnsOrigin;
use crate::telemetry::traces::{LogFormat, TraceOptions};

pub mod flags;

mod validate;

pub use crate::units::{ByteSize, HumanDuration};
pub use flags::Flags;

/// How an option is given on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagKind {
    /// `--name VALUE`, the value read as an environment variable's would be.
    Value,
    /// `--name A,B,C`: a comma-separated list.
    List,
    /// `--name` alone for `true`, or `--name false`.
    Switch,
    /// No flag: a list of tables, set in the TOML file only.
    TomlOnly,
}

/// One option as declared: its TOML key (the flag and the environment variable derive from
/// it), its documentation and its kind of flag.
#[derive(Debug, Clone, Copy)]
pub struct OptionSpec {
    /// The TOML key, e.g. `block_size`.
    pub name: &'static str,
    /// Its documentation, one line per `///` line.
    pub doc: &'static str,
    /// How it is given on the command line.
    pub flag: FlagKind,
}

/// Declares the options: each is written once, as `/// docs`, `name: Type = default`, and
/// optionally `=> FlagKind` (default `Value`).
macro_rules! options {
    ($(
        $(#[doc = $doc:literal])+
        $name:ident : $ty:ty = $default:expr $(=> $flag:ident)? ;
    )+) => {
        /// Larder's whole configuration.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct Config {
            $( $(#[doc = $doc])+ pub $name: $ty, )+
        }

        impl Default for Config {
            fn default() -> Self {
                Self { $( $name: $default, )+ }
            }
        }

        /// Every option, in the order declared.
        pub const OPTIONS: &[OptionSpec] = &[$(
            OptionSpec {
                name: stringify!($name),
                doc: concat!($($doc, "\n"),+),
                flag: options!(@flag $($flag)?),
            },
        )+];
    };
    (@flag) => { FlagKind::Value };
    (@flag $flag:ident) => { FlagKind::$flag };
}

options! {
    /// Address of the S3 listener. Default: `127.0.0.1:9000`.
    listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 9000));
    /// Address of the admin listener (`/healthz`, `/readyz`, `/metrics`). Default: `127.0.0.1:9001`.
    admin_listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 9001));
    /// Most client connections the S3 listener holds open at once; further clients wait in the
    /// listen backlog until one closes. Default: `4096`.
    max_connections: usize = 4096;
    /// Threads that serve requests (tokio's workers). `0` means one per CPU this process may
    /// use (cgroup quotas included). Fewer threads than CPUs suit a Larder sharing its machine:
    /// on a 2-core VM shared with the benchmark's load generator, one worker served 4 KiB hits
    /// with 10 to 19 % less CPU per request and less than half the p99, at 0 to 10 % less
    /// throughput, because no idle worker was parked and woken per request
    /// (docs/benchmarks.md). Disk I/O threads are not counted here. Default: `0`.
    worker_threads: usize = 0;
    /// Which cleartext HTTP/1.1 clients get bodies of cached bytes by reference (64 KiB and
    /// up, of a block the memory tier served often: `vmsplice` into a pipe, `splice` to the
    /// socket, as `sendfile` does) instead of copied into the socket: `auto`, `remote`
    /// (clients on other hosts only), `always` or `never`. Default: `auto`: clients on other
    /// hosts get every such body by reference, clients on this host those of blocks of at most
    /// 256 KiB, and of at most 1 MiB while eight or more connections on this host are sending
    /// bodies of 64 KiB and up (within the last 100 to 200 ms). By reference the server's copy
    /// is gone (a fifth to three fifths of a hit's CPU), but a client on this host then makes
    /// the only copy itself: on loopback, one client reading 512 KiB to 64 MiB hits got 15 to
    /// 58 % less throughput that way, and 8 and 64 MiB hits cost the machine 23 to 57 % more
    /// CPU, while 64 to 256 KiB hits came out even or better for the client and the machine
    /// alike, and eight to sixty-four connections reading 1 MiB hits got 27 to 33 % more
    /// throughput for 39 to 46 % less of the server's CPU (docs/benchmarks.md).
    send_by_reference: SendByReference = Default::default();
    /// Longest a client may take to send a request's headers before its connection is closed
    /// (guards against slowloris clients). Default: `10s`.
    client_header_timeout: HumanDuration = HumanDuration::secs(10);
    /// Longest a client connection (HTTP/1 or HTTP/2) may stay open with no bytes moving either
    /// way; a connection that sends no first request within `client_header_timeout` is closed
    /// too, so idle connections cannot hold every `max_connections` slot. Checked every
    /// quarter of the shorter of the two timeouts, so a connection may stay up to half that
    /// longer. Default: `60s`.
    client_idle_timeout: HumanDuration = HumanDuration::secs(60);
    /// Most requests one HTTP/2 connection may have in flight at once. Default: `256`.
    client_max_streams: u32 = 256;
    /// File holding the bearer token that the admin listener's mutating and revealing routes
    /// (`/warm`, `/fleet`) require (`Authorization: Bearer <token>`). Without it those routes
    /// answer only on a loopback admin listener; metrics, health and the status page stay
    /// open. Default: none.
    admin_token_file: Option<PathBuf> = None;
    /// File holding the bearer token that S3 event notifications must carry to
    /// `POST /v1/events` on the admin listener (MinIO's webhook `auth_token`; at least 16
    /// bytes). An event for an object drops its cached metadata, listing pages and remembered
    /// 404 at once (here and, in a fleet, in every replica), so a write straight to the bucket
    /// is seen without waiting for a TTL. Without it the route refuses every event. Setting it
    /// makes Larder expect events (see `events_max_silence`). SNS presents the token as the
    /// password of HTTP Basic credentials in the subscription's URL. Default: none.
    events_token_file: Option<PathBuf> = None;
    /// While S3 events are expected (`events_token_file` or `events_sqs_queue_url` is set): the
    /// longest time without an event (or heartbeat, `events_heartbeat`) before the stream is
    /// taken as broken, logged, and metadata, listings and 404s are trusted only for
    /// `events_fallback_ttl` until events arrive again. The stream also starts out so, until its first event. Default: `60s`.
    events_max_silence: HumanDuration = HumanDuration::secs(60);
    /// What metadata, listings and 404s are trusted for while the event stream is not healthy
    /// (`events_max_silence`), instead of their TTLs; immutable prefixes (`rules`) are not
    /// affected. With the defaults, a broken stream leaves nothing stale longer than the 60 s
    /// Larder trusts without events. Default: `60s`.
    events_fallback_ttl: HumanDuration = HumanDuration::secs(60);
    /// `bucket/key` of an object Larder writes every third of `events_max_silence` (with its
    /// own upstream credentials), so that the bucket's notifications prove the event stream
    /// works even when nothing else is written. The bucket must send that key's events to
    /// Larder. Default: none (only real writes show the stream is alive).
    events_heartbeat: Option<String> = None;
    /// URL of an SQS queue Larder long-polls for S3 events (S3 -> SQS, S3 -> SNS -> SQS,
    /// EventBridge -> SQS), deleting each batch once applied; signed with the upstream's
    /// credentials, in the region the URL names (else `upstream_region`); over HTTPS its
    /// certificate is checked against the system's CA certificates and `upstream_ca_file`'s.
    /// Setting it makes Larder expect events (see `events_max_silence`). Default: none.
    events_sqs_queue_url: Option<String> = None;
    /// Origins (`scheme://host[:port]`, `*` standing for one DNS label) where an SNS
    /// `SubscribeURL` may point: Larder confirms an SNS subscription to `POST /v1/events` by
    /// fetching that URL, and fetches no other. Default: `https://sns.*.amazonaws.com`,
    /// `https://sns.*.amazonaws.com.cn`.
    events_sns_origins: Vec<SnsOrigin> = SnsOrigin::aws() => List;
    /// How clients authenticate: `sigv4` (every request signed with AWS Signature Version 4 by a
    /// key in `auth_credentials`) or `none` (anyone who reaches the listener reads and writes
    /// through Larder's upstream credentials; logged as a warning). Default: `sigv4`.
    auth: AuthMode = Default::default();
    /// File of client keys, one `access_key_id:secret_access_key` per line, `#` comments.
    /// Required with `auth = "sigv4"`. Default: none.
    auth_credentials: Option<PathBuf> = None;
    /// Per-key policies: the buckets a key may use and what it may do there (`read-only`,
    /// `read-write` for object writes, `admin` for bucket administration too). TOML only, e.g.
    /// `[[auth_policies]] access_key = "analytics", buckets = ["lake", "logs-*"],
    /// access = "read-only"`. A policy may also limit the key's `requests_per_second` (past
    /// it, `503 SlowDown`) and `bytes_per_second` (its responses paced), per replica. Keys
    /// without a policy may do everything, unlimited. Default: none.
    auth_policies: Vec<KeyPolicy> = Vec::new() => TomlOnly;
    /// PEM certificate chain for TLS on the S3 listener; with `tls_key`, the listener speaks
    /// HTTPS only. Both files are re-read when they change. Default: none (plain HTTP).
    tls_cert: Option<PathBuf> = None;
    /// PEM private key for `tls_cert`. Default: none.
    tls_key: Option<PathBuf> = None;
    /// Base domain for virtual-hosted-style requests (`bucket.<base_domain>`). Default: none, so
    /// only path-style requests (`/bucket/key`) are understood.
    base_domain: Option<String> = None;
    /// The upstream S3 endpoint URL. Default: none, meaning the AWS SDKs' own setting
    /// (`AWS_ENDPOINT_URL`, a profile's `endpoint_url`), else AWS S3 for the region.
    upstream_endpoint: Option<String> = None;
    /// The upstream region. Default: `us-east-1`.
    upstream_region: String = "us-east-1".to_owned();
    /// Address upstream buckets path-style (needed by MinIO and most S3-compatible servers).
    /// Default: `false`.
    upstream_path_style: bool = false => Switch;
    /// PEM file of CA certificates trusted for the upstream's TLS (an `https://` endpoint),
    /// besides the system's: for an S3-compatible store behind a private certificate
    /// authority; the SQS client of `events_sqs_queue_url` trusts them too. Read once at
    /// start; a file without a usable certificate stops Larder.
    /// Default: none (the system's certificates only; `SSL_CERT_FILE` or `SSL_CERT_DIR`
    /// replace those).
    upstream_ca_file: Option<PathBuf> = None;
    /// Read Requester Pays buckets: every request Larder makes of its own (block GETs, HEADs,
    /// the listings of warm-up, the events heartbeat's write) says that Larder pays for it (`x-amz-request-payer:
    /// requester`), so those requests and their bytes are billed to the account of Larder's
    /// upstream credentials, once per block, however many clients read it. Reads that say
    /// they pay (that header, or the `x-amz-request-payer=requester` parameter of a presigned
    /// URL) are then answered from the cache like any other; without this option they pass
    /// through. Any client Larder lets read a bucket (`auth_policies`) reads it at that
    /// account's cost, whether or not it says it pays. S3 ignores the header on other buckets.
    /// Default: `false`.
    upstream_requester_pays: bool = false => Switch;
    /// Bytes of block data the memory tier holds. From 256 MiB up, a sixteenth of them holds
    /// the blocks its admission turned away or its eviction let go, for the readers that come
    /// just after (a herd's stragglers). Default: `512MiB`.
    memory_capacity: ByteSize = ByteSize(512 << 20);
    /// Size of the blocks objects are cut into. Default: `8MiB`.
    block_size: ByteSize = ByteSize(8 << 20);
    /// How long object metadata (size, ETag, headers) is trusted before it is fetched again; an
    /// object overwritten upstream is served with its old contents for at most this long.
    /// `0s` revalidates on every request. Metadata of a named version (`versionId`) expires
    /// too: its bytes never change, but it can be deleted. Writes through Larder drop what they
    /// change at once.
    /// Default: `60s`.
    metadata_ttl: HumanDuration = HumanDuration::secs(60);
    /// Most object-metadata entries held; as many object names are also remembered as read
    /// before, so that they revalidate with a HEAD (an object not remembered is opened with a
    /// GET of its first needed block, which brings the metadata too). Default: `100000`.
    metadata_capacity: u64 = 100_000;
    /// Revalidate the metadata of an object read often (its 16th read since the metadata was
    /// fetched, or a later one) in the last tenth of its TTL (at least 1 s, at most a quarter;
    /// of `events_fallback_ttl` while an expected event stream is silent) with a HEAD behind
    /// the reader, so the readers of a hot object never wait for one. No metadata is trusted
    /// longer than its TTL either way. A hot object then costs a HEAD every nine tenths of its
    /// TTL instead of every TTL; immutable prefixes are never refreshed. Default: `true`.
    metadata_refresh_ahead: bool = true => Switch;
    /// Learn an object's checksums for the clients that ask for them
    /// (`x-amz-checksum-mode: ENABLED`, which current AWS SDKs send on every GetObject, and
    /// with which they check the bytes they get against what S3 stored). An object first read
    /// through Larder is opened with a ranged GET, which never carries them, so until its
    /// metadata is revalidated it is answered without them. With this on, a whole read (GET
    /// or HEAD) asking for them from such metadata sends one HEAD behind the reader, once per
    /// cached entry; the reads after it get them. The read that opened the object does not: an
    /// object read once costs no HEAD. Off by default: with the SDKs asking on every read, it
    /// costs a HEAD for nearly every object read twice, on top of the GETs a cache is there to
    /// save. Off, they come with the first revalidation (`metadata_ttl`), or never for
    /// immutable prefixes. Default: `false`.
    learn_checksums: bool = false => Switch;
    /// How long a 404 for a key (no such key, or no such bucket) is remembered, so a repeated
    /// GET or HEAD of a missing key costs no upstream request. Dropped at once by a write of
    /// the key through Larder, an S3 event or another replica's notice; a write straight to the
    /// bucket without events is seen only after it. `0s` (the default) remembers none: many
    /// jobs poll for a marker object (`_SUCCESS`) and must see it the moment it is written.
    /// Default: `0s`.
    negative_ttl: HumanDuration = HumanDuration::secs(0);
    /// How long a listing page (ListObjectsV2, ListObjects) is kept, so a repeated listing of
    /// an unchanged prefix costs no upstream request. Dropped at once by a write under its
    /// prefix through Larder, an S3 event or another replica's notice. `0s` (the default)
    /// keeps none. Default: `0s`.
    list_ttl: HumanDuration = HumanDuration::secs(0);
    /// Most bytes of listing pages kept (`list_ttl`). Default: `64MiB`.
    list_capacity: ByteSize = ByteSize(64 << 20);
    /// Freshness by bucket and key prefix: each rule sets, for keys starting with `prefix` in
    /// `bucket`, any of `metadata_ttl`, `list_ttl` and `negative_ttl`, or `immutable = true`
    /// (objects written once and never changed, like a table format's data files: their
    /// metadata is never revalidated, only dropped by a write or event). The longest matching
    /// prefix wins; what it leaves unset comes from the options above. TOML only, e.g.
    /// `[[rules]] bucket = "lake", prefix = "warehouse/data/", immutable = true`.
    /// Default: none.
    rules: Vec<FreshnessRule> = Vec::new() => TomlOnly;
    /// Blocks a single response fetches ahead of the one it is sending. Default: `8`: a whole
    /// cold 64 MiB object (eight 8 MiB blocks) is then fetched at once, 3.5 times a single
    /// GET's throughput from an upstream capping each connection as S3 does (4 made it 2.4
    /// times; docs/benchmarks.md). Where parallel GETs were seen to bring no more than one,
    /// a cold read's first GET runs on over the whole window instead (`read/blocks/gain.rs`).
    read_window: usize = 8;
    /// How a range of a block nothing here holds is fetched: `exact` (range-first: a range the
    /// whole block would bring more than 1.5 times the bytes of is fetched as asked, and cached
    /// as a part found again by the same range; a multipart upload's part read by `partNumber`
    /// is cut so wherever it covers a block in part) or `block` (always the whole block). Default:
    /// `exact`: cold column chunks cost the upstream their own bytes, not their blocks'.
    cold_ranges: ColdRanges = Default::default();
    /// With `cold_ranges = "exact"`: after this many different ranges of one block were
    /// fetched as parts (within 10 minutes), the whole block is fetched behind the reader, as
    /// read-ahead (needs `prefetch = "auto"`). `0` never. Default: `2`: random ranges over
    /// hot objects then cost a block, not a GET per range; Parquet scans that read each
    /// column chunk again exactly do better with `0` (docs/benchmarks.md). Ranges only: the
    /// pieces of blocks a multipart upload's parts are read as never complete a block.
    complete_block_after: u32 = 2;
    /// Most bytes of blocks all responses in flight hold at once: each holds the block it is
    /// sending and those opened ahead of it, which may have left the memory tier. A response
    /// whose next block would go over waits (counted); the block a response starts with goes
    /// before blocks opened ahead, which hold at most seven eighths. Blocks further ahead than
    /// a response's next one are opened only in room to spare (at most half the buffer in
    /// all), else once they are next: readers that stop or read slowly cannot hold the
    /// buffer that others' next blocks need. At least one block. A quarter of it bounds the
    /// pool of idle large buffers kept for reuse. Default: `1GiB`.
    response_buffer: ByteSize = ByteSize(1 << 30);
    /// Longest an upstream body (or a peer's) may fall silent before it counts as broken: it is
    /// then resumed from the byte where it stopped (`upstream_max_resumes`), or fails. Default:
    /// `10s`: a body silent that long from S3 is a broken connection, and readers wait for it.
    /// (The S3 client cut silent bodies after about 5 s on its own until 2026-11-27, whatever
    /// this said; 30 s, the earlier default, held readers six times as long.)
    upstream_idle_timeout: HumanDuration = HumanDuration::secs(10);
    /// Most block fetches running upstream at once, across all requests; further fetches wait
    /// their turn. Bounds the memory of fetches in flight to this many blocks. Default: `64`.
    upstream_concurrency: usize = 64;
    /// Cache file or raw block device of the disk tier. Default: none, so Larder caches in
    /// memory only.
    disk_path: Option<PathBuf> = None;
    /// Bytes of the device the disk tier uses; a file is created and preallocated to this size.
    /// Default: `10GiB`.
    disk_capacity: ByteSize = ByteSize(10 << 30);
    /// Region size: the disk tier's unit of append and eviction, 1MiB to 256MiB in whole MiB,
    /// and larger than a block. Default: `65MiB`: every block on disk carries a header of a
    /// few hundred bytes, so 64 MiB would hold seven 8 MiB blocks and leave an eighth of each
    /// region empty; 65 MiB holds 64 MiB of any power-of-two block from 1 to 64 MiB with their
    /// headers.
    disk_region_size: ByteSize = ByteSize(65 << 20);
    /// I/O engine of the disk tier: `psync` (pread/pwrite on threads) or `uring` (io_uring,
    /// falling back to psync where the kernel refuses it). Default: `psync`: on our VMs it read as
    /// fast as io_uring with a lower p99, while io_uring filled faster (docs/benchmarks.md).
    io_engine: EngineKind = Default::default();
    /// Serve disk hits through the kernel's page cache: a disk block read again is copied from
    /// memory the kernel holds (on the request's own thread when every page is cached), as
    /// nginx's cache hits are, instead of another O_DIRECT device read. Writes, reclaim and
    /// recovery stay O_DIRECT, so only blocks clients read take page cache. Every read is
    /// verified against its checksums either way. That memory is the kernel's, outside
    /// `memory_capacity`, and given back under pressure (in a container it counts towards the
    /// memory limit as page cache does). Default: `true`: one client reading 1 MiB disk hits
    /// went from about half of nginx's throughput to nginx's (docs/benchmarks.md).
    disk_page_cache: bool = true => Switch;
    /// Which blocks are written to disk once it is full: `second-hit` (S3-FIFO's rule: a block
    /// read again while memory held it, by more than one request through its fetch or with
    /// another request in progress over it, or fetched again while the disk remembers turning
    /// it away; one-off reads never cost a disk write or disk space) or `always`. Default:
    /// `second-hit`: on the trace replay it beat `always` by 0.6 to 3.1 points of hit ratio in
    /// 10 of 12 runs (lost up to 1.4 on a web trace) and wrote 2 to 6 times less to disk
    /// (docs/benchmarks.md). Until the disk is full, everything is written.
    disk_admission: Admission = Admission::SecondHit;
    /// Most bytes per second written to the disk tier; blocks over it are dropped (and counted).
    /// `0` means no limit. Default: `512MiB`, a quarter of a typical NVMe device's write rate,
    /// leaving the rest for reads.
    disk_write_rate: ByteSize = ByteSize(512 << 20);
    /// Bytes of blocks accepted for a disk write and not yet written, per partition; beyond it
    /// blocks are dropped (and counted), so a slow disk never grows memory. Default: `64MiB`.
    disk_write_buffer: ByteSize = ByteSize(64 << 20);
    /// What to do with the disk tier's contents at start: `none` (start empty), `quiet` (recover
    /// what verifies, reformat on a format change), `strict` (recover, but refuse to start on a
    /// format change or damaged region metadata). Default: `quiet`.
    disk_recovery: Recovery = Default::default();
    /// When blocks reach the disk tier: `on-evict` (when memory lets them go, so a fetched block
    /// is held once and the two tiers' capacities add up; memory is written down at shutdown, a
    /// crash loses what only memory held) or `on-insert` (as soon as they are fetched, so a
    /// crash keeps them; memory repeats part of the disk). Default: `on-evict`.
    disk_write_policy: WritePolicy = WritePolicy::OnEvict;
    /// Named disk partitions, each with its own capacity and the buckets cached in it; other
    /// buckets use the partition `default` (the capacity left over). TOML only, e.g.
    /// `[[disk_partitions]] name = "tables", capacity = "100GiB", buckets = ["lake"]`.
    /// Default: none (one partition).
    disk_partitions: Vec<DiskPartition> = Vec::new() => TomlOnly;
    /// File holding the key the disk tier is encrypted with: 32 random bytes written as 64
    /// hexadecimal digits (`openssl rand -hex 32`), surrounding whitespace ignored. Every block
    /// written to disk is then sealed with AES-256-GCM under a key of its own, derived from the
    /// device's data key (random, kept on the device wrapped under this key): the device holds
    /// neither object bytes nor object names in clear, and bytes changed on it fail their
    /// authentication and are fetched again, never served. This key never reaches the device;
    /// read at start only. A restart with another key (unless it is rotated in with
    /// `disk_encryption_previous_key_file`), or with encryption turned on or off, starts the disk
    /// tier empty (`disk_recovery = "strict"` refuses to start instead). Default: none: blocks
    /// on disk are checksummed (CRC32C), not encrypted.
    disk_encryption_key_file: Option<PathBuf> = None;
    /// File holding the key being rotated out, in the same form: a device whose data key it
    /// unwraps (and `disk_encryption_key_file`'s does not) keeps its contents, its data key
    /// wrapped under the new key from then on, and the old key opens it no more. Harmless once
    /// the rotation is done, so it can stay set until every replica restarted. Needs
    /// `disk_encryption_key_file`. Default: none.
    disk_encryption_previous_key_file: Option<PathBuf> = None;
    /// Longest wait to connect to the upstream. Default: `5s`.
    upstream_connect_timeout: HumanDuration = HumanDuration::secs(5);
    /// Longest wait for an upstream response's headers, per attempt. Default: `30s`.
    upstream_first_byte_timeout: HumanDuration = HumanDuration::secs(30);
    /// Attempts per upstream request (block GETs and HEADs) on 5xx and connection faults, with
    /// exponential backoff and jitter, and on SlowDown (503) or 429 after the throttled
    /// prefix's pace (`upstream/throttle.rs`; a refusal before the prefix was paced does not
    /// count); 1 disables retries. Default: `3`.
    upstream_max_attempts: u32 = 3;
    /// Times an upstream body (a block's, or a cold suffix read's) that breaks or stalls
    /// mid-stream is resumed from the byte where it stopped (a new ranged GET pinned to the same
    /// ETag); 0 fails the read instead. Default: `3`.
    upstream_max_resumes: u32 = 3;
    /// Hedge a block GET that has not answered within this quantile (0 to 1, e.g. `0.95`) of
    /// recent upstream first-byte latencies: send a second, keep the first to answer, cancel
    /// the other. `0` is off. Default: `0`.
    upstream_hedge_quantile: f64 = 0.0;
    /// Send each block GET of a known version as up to this many ranged GETs at once (pieces
    /// of at least 1 MiB, pinned to the same ETag, handed on in order), for an upstream that
    /// caps each connection's bandwidth as S3 does; each costs a request. 1 is off (1 to 16).
    /// Default: `1`.
    upstream_fetch_pieces: u32 = 1;
    /// When the upstream fails (5xx, timeout, unreachable) while refreshing expired metadata,
    /// keep serving what is cached if the metadata expired at most this long ago, marked
    /// `X-Cache: stale-*`. `0s` is off. Default: `0s`.
    serve_stale_on_error: HumanDuration = HumanDuration::secs(0);
    /// Read-ahead across ranged GETs: `auto` (readers that read an object in order get the
    /// next blocks fetched before they ask) or `off`. Default: `auto`.
    prefetch: PrefetchMode = Default::default();
    /// Blocks fetched ahead when an in-order reader is first seen. Default: `2`.
    prefetch_min_window: u64 = 2;
    /// Most blocks fetched ahead of one reader; the window doubles up to it while the reader
    /// keeps reading in order. Default: `16`.
    prefetch_max_window: u64 = 16;
    /// Most read-ahead fetches at once across all readers (each holds a block in flight).
    /// Read-ahead also only uses upstream slots that are free, so demand fetches go first.
    /// Default: `16`.
    prefetch_max_inflight: usize = 16;
    /// Blocks a warm-up job fetches at once. Default: `4`.
    warm_concurrency: usize = 4;
    /// Most bytes per second a warm-up job fetches. Default: `256MiB`.
    warm_rate: ByteSize = ByteSize(256 << 20);
    /// Log line format on stderr: `text` or `json` (one object per line). Default: `text`.
    log_format: LogFormat = Default::default();
    /// Log lines written while a request runs carry its span's fields (operation, method,
    /// bucket, cache outcome, request id). Building and formatting that span for every request
    /// cost about a tenth of a small hit's CPU, so it is off; a failed request's line names
    /// its request id either way. Default: `false`.
    log_spans: bool = false => Switch;
    /// Base URL of an OpenTelemetry collector's OTLP/HTTP receiver (e.g. `http://otel:4318`);
    /// metrics are pushed to `<url>/v1/metrics` and traces to `<url>/v1/traces`. Default: none
    /// (metrics on the admin `/metrics` only, no traces).
    otlp_endpoint: Option<String> = None;
    /// How often metrics are pushed by OTLP. Default: `10s`.
    otlp_interval: HumanDuration = HumanDuration::secs(10);
    /// Requests that take at least this long (headers to last byte) have their whole trace
    /// exported by OTLP; faster ones are dropped unless sampled. Default: `1s`.
    trace_slow_threshold: HumanDuration = HumanDuration::secs(1);
    /// Share (0 to 1) of the faster requests whose traces are exported too. Default: `0`.
    trace_sample_ratio: f64 = 0.0;
    /// Buckets whose name appears in a `bucket` label on the request, bytes and cost metrics;
    /// other buckets are counted as `other`. Empty leaves the label out, so an unbounded set of
    /// bucket names never reaches the metrics. Default: none.
    metrics_buckets: Vec<String> = Vec::new() => List;
    /// Count each client key's requests, and what the cache saved them, in `larder_key_*`
    /// series labelled by access key: every key of the credentials file has its series (a
    /// bounded set the configuration names). `false` leaves them out. Default: `true`.
    metrics_keys: bool = true => Switch;
    /// Dollars per 1,000 GET-class requests (GET, HEAD and all others not listed below), for the
    /// cost metrics. Default: `0.0004` (S3 Standard, us-east-1).
    price_get_per_1000: f64 = 0.0004;
    /// Dollars per 1,000 PUT-class requests (PUT, COPY, POST, LIST). Default: `0.005`.
    price_put_per_1000: f64 = 0.005;
    /// Dollars per GB (10^9 bytes) leaving S3 for the internet. Default: `0.09`.
    price_internet_per_gb: f64 = 0.09;
    /// Dollars per GB from S3 to another AWS region. Default: `0.02`.
    price_cross_region_per_gb: f64 = 0.02;
    /// Dollars per GB crossing availability zones. Default: `0.01`.
    price_cross_az_per_gb: f64 = 0.01;
    /// Where bytes from S3 travel to reach Larder (and would travel to reach the clients
    /// directly), choosing the per-GB price: `same-region` (free), `cross-az`, `cross-region`
    /// or `internet`. Default: `same-region`.
    upstream_transfer: TransferKind = Default::default();
    /// Fleet members as a fixed list of peer addresses (`host:port` of each replica's
    /// `fleet_listen`, this replica's own among them). Setting one of `fleet_peers`,
    /// `fleet_peers_file` or `fleet_peers_dns` makes this replica part of a fleet: each block
    /// is owned by one replica, and the others ask it instead of S3. Default: none (alone).
    fleet_peers: Vec<String> = Vec::new() => List;
    /// A file of fleet members (`host:port`, whitespace or comma separated, `#` comments),
    /// re-read every `fleet_refresh`. Replace it whole (write another file, then rename it over
    /// this one): a refresh that reads it half-written sees only the members written so far
    /// (an empty file, or one of comments only, keeps the current view). Default: none.
    fleet_peers_file: Option<PathBuf> = None;
    /// A DNS name and port whose addresses are the fleet members, re-resolved every
    /// `fleet_refresh`: on Kubernetes, the headless Service of the StatefulSet
    /// (`larder-peers.ns.svc.cluster.local:9002`). Default: none.
    fleet_peers_dns: Option<String> = None;
    /// Address of the peer listener, where the other replicas ask for blocks. Default:
    /// `127.0.0.1:9002` (the Helm chart listens on all addresses).
    fleet_listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 9002));
    /// This replica's name in the member list, until a probe finds which listed name answers
    /// with its own id. Default: none (`fleet_listen`).
    fleet_advertise: Option<String> = None;
    /// File holding the secret every replica signs peer requests with (at least 16 bytes).
    /// Required in a fleet. Default: none.
    fleet_secret_file: Option<PathBuf> = None;
    /// PEM certificate chain this replica presents on `fleet_listen`. With `fleet_tls_key` and
    /// `fleet_tls_ca`, replicas speak TLS to each other (and only TLS: a replica without it
    /// cannot reach this one, and asks S3 instead). The files are re-read when they change.
    /// Default: none (peer traffic in clear, still signed and sealed).
    fleet_tls_cert: Option<PathBuf> = None;
    /// PEM private key for `fleet_tls_cert`. Default: none.
    fleet_tls_key: Option<PathBuf> = None;
    /// PEM file of the CA certificates a peer's certificate must chain to: these alone, never
    /// the system's. Read at start. Default: none.
    fleet_tls_ca: Option<PathBuf> = None;
    /// The name every peer's certificate must carry, whatever address the peer is reached at
    /// (replicas found through DNS are reached by IP). Default: none (the host in the peer's
    /// address; the Helm chart uses `larder-fleet`).
    fleet_tls_name: Option<String> = None;
    /// This replica's zone (on Kubernetes, the node's `topology.kubernetes.io/zone`).
    /// Default: none.
    fleet_zone: Option<String> = None;
    /// Which replicas may own a block for this one: `zone` (those in its zone: a block leaves
    /// S3 once per zone, and no block crosses zones) or `fleet` (all: once per fleet, crossing
    /// zones). Default: `zone`.
    fleet_scope: Scope = Default::default();
    /// How often the member list is read and every member probed. Default: `5s`.
    fleet_refresh: HumanDuration = HumanDuration::secs(5);
    /// How long a peer has to start answering before this replica asks S3 itself (and counts
    /// a fallback). Default: `2s`.
    fleet_peer_timeout: HumanDuration = HumanDuration::secs(2);
    /// Bytes of blocks fetched from their owners kept in this replica's memory for its next
    /// readers (TinyLFU keeps the hot ones), apart from the memory tier. `0` keeps none.
    /// Default: `64MiB`.
    fleet_copy_capacity: ByteSize = ByteSize(64 << 20);
    /// How long a block fetched from its owner is kept here. Default: `30s`.
    fleet_copy_ttl: HumanDuration = HumanDuration::secs(30);
}

/// See [`Config::prefetch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum PrefetchMode {
    /// Read ahead of in-order readers.
    #[default]
    Auto,
    /// No read-ahead.
    Off,
}

/// See [`Config::send_by_reference`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SendByReference {
    /// To clients whose address is not this host's (not loopback, not the address they
    /// connected to); to clients on this host only bodies of blocks up to 256 KiB, or up to
    /// 1 MiB while eight connections on this host are sending large bodies.
    #[default]
    Auto,
    /// To clients whose address is not this host's only.
    Remote,
    /// To every cleartext HTTP/1.1 client.
    Always,
    /// To none: every body is copied into the socket.
    Never,
}

/// See [`Config::cold_ranges`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ColdRanges {
    /// Fetch a range much smaller than its block as asked.
    #[default]
    Exact,
    /// Fetch whole blocks.
    Block,
}

/// See [`Config::upstream_transfer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum TransferKind {
    /// Within one region: S3 charges nothing.
    #[default]
    SameRegion,
    /// Across availability zones.
    CrossAz,
    /// To another region.
    CrossRegion,
    /// To the internet.
    Internet,
}

/// One freshness rule (`rules`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreshnessRule {
    /// The bucket.
    pub bucket: String,
    /// The key prefix (empty: the whole bucket).
    #[serde(default)]
    pub prefix: String,
    /// Overrides `metadata_ttl`.
    #[serde(default)]
    pub metadata_ttl: Option<HumanDuration>,
    /// Objects here are never changed once written.
    #[serde(default)]
    pub immutable: bool,
    /// Overrides `list_ttl`.
    #[serde(default)]
    pub list_ttl: Option<HumanDuration>,
    /// Overrides `negative_ttl`.
    #[serde(default)]
    pub negative_ttl: Option<HumanDuration>,
}

/// One disk partition and the buckets it caches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskPartition {
    /// Name, 1 to 32 bytes.
    pub name: String,
    /// Bytes of the device it holds.
    pub capacity: ByteSize,
    /// Buckets cached in it.
    #[serde(default)]
    pub buckets: Vec<String>,
}

/// Why a configuration was refused. The message names the offending field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A source could not be read or a value did not parse.
    #[error("invalid configuration: {0}")]
    Source(#[from] Box<figment::Error>),
    /// A value parsed but is out of range.
    #[error("invalid configuration: `{field}` {problem}")]
    Invalid {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
}

impl Config {
    /// Whether S3 events are expected (so their absence means the stream is broken).
    pub fn expects_events(&self) -> bool {
        self.events_token_file.is_some() || self.events_sqs_queue_url.is_some()
    }

    /// Whether this replica is part of a fleet.
    pub fn in_fleet(&self) -> bool {
        !self.fleet_peers.is_empty()
            || self.fleet_peers_file.is_some()
            || self.fleet_peers_dns.is_some()
    }

    /// Load from defaults, then `file` (if given), then `LARDER_*` variables, then `overrides`
    /// (the command-line flags that were set), and validate.
    pub fn load(
        file: Option<&std::path::Path>,
        overrides: impl Serialize,
    ) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::Invalid {
                    field: "config",
                    problem: format!("file {} does not exist", path.display()),
                });
            }
            figment = figment.merge(Toml::file(path));
        }
        let config: Config = figment
            .merge(Env::prefixed("LARDER_"))
            .merge(Serialized::defaults(overrides))
            .extract()
            .map_err(Box::new)?;
        config.validate()?;
        Ok(config)
    }
}

impl Config {
    /// The prices the cost metrics use.
    pub fn traces(&self) -> TraceOptions {
        TraceOptions {
            log_format: self.log_format,
            log_spans: self.log_spans,
            otlp_endpoint: self.otlp_endpoint.clone(),
            slow_threshold: self.trace_slow_threshold.0,
            sample_ratio: self.trace_sample_ratio,
        }
    }

    /// What the metrics price requests and bytes at.
    pub fn prices(&self) -> crate::telemetry::metrics::Prices {
        let per_gb = match self.upstream_transfer {
            TransferKind::SameRegion => 0.0,
            TransferKind::CrossAz => self.price_cross_az_per_gb,
            TransferKind::CrossRegion => self.price_cross_region_per_gb,
            TransferKind::Internet => self.price_internet_per_gb,
        };
        crate::telemetry::metrics::Prices {
            get_request: self.price_get_per_1000 / 1000.0,
            put_request: self.price_put_per_1000 / 1000.0,
            transfer_byte: per_gb / 1e9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure must return figment's own error
    fn layers_apply_in_order_and_errors_name_the_field() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("LARDER_AUTH", "none");
            jail.create_file(
                "larder.toml",
                "block_size = \"1MiB\"\nmetadata_ttl = \"5s\"\nmemory_capacity = \"64MiB\"\n",
            )?;
            jail.set_env("LARDER_METADATA_TTL", "7s");
            let path = jail.directory().join("larder.toml");
            let c = Config::load(Some(&path), Flags::default()).expect("loads");
            assert_eq!(c.block_size, ByteSize(1 << 20));
            assert_eq!(c.metadata_ttl.0, Duration::from_secs(7));
            let flags = Flags::parse(["--block-size", "2MiB", "--upstream-path-style"]);
            let c = Config::load(Some(&path), &flags).expect("loads");
            assert_eq!(c.block_size, ByteSize(2 << 20));
            assert!(c.upstream_path_style);
            let flags = Flags::parse([
                "--fleet-peers",
                "a:1,b:2",
                "--fleet-secret-file",
                "/s",
                "--read-window",
                "3",
            ]);
            let c = Config::load(Some(&path), &flags).expect("loads");
            assert_eq!(c.fleet_peers, ["a:1", "b:2"]);
            assert_eq!(c.read_window, 3);

            jail.set_env("LARDER_BLOCK_SIZE", "lots");
            let err = Config::load(Some(&path), Flags::default())
                .unwrap_err()
                .to_string();
            assert!(err.to_lowercase().contains("block_size"), "{err}");
            jail.set_env("LARDER_BLOCK_SIZE", "1KiB");
            let err = Config::load(Some(&path), Flags::default())
                .unwrap_err()
                .to_string();
            assert!(err.to_lowercase().contains("block_size"), "{err}");
            jail.set_env("LARDER_BLOCK_SIZE", "1MiB");
            jail.set_env("LARDER_NO_SUCH_OPTION", "1");
            let err = Config::load(Some(&path), Flags::default())
                .unwrap_err()
                .to_string();
            assert!(err.contains("no_such_option"), "{err}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure must return figment's own error
    fn disk_options_parse_from_toml_and_env() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("LARDER_AUTH", "none");
            jail.create_file(
                "larder.toml",
                r#"
disk_path = "/tmp/larder.cache"
disk_capacity = "20GiB"
io_engine = "psync"
disk_admission = "always"
disk_write_policy = "on-evict"

[[disk_partitions]]
name = "tables"
capacity = "8GiB"
buckets = ["lake", "warehouse"]
"#,
            )?;
            jail.set_env("LARDER_DISK_RECOVERY", "strict");
            let path = jail.directory().join("larder.toml");
            let c = Config::load(Some(&path), Flags::default()).expect("loads");
            assert_eq!(c.disk_capacity, ByteSize(20 << 30));
            assert_eq!(c.io_engine, EngineKind::Psync);
            assert_eq!(c.disk_admission, Admission::Always);
            assert_eq!(c.disk_write_policy, WritePolicy::OnEvict);
            assert_eq!(c.disk_recovery, Recovery::Strict);
            assert_eq!(c.disk_partitions[0].buckets, ["lake", "warehouse"]);

            jail.set_env("LARDER_IO_ENGINE", "spdk");
            let err = Config::load(Some(&path), Flags::default())
                .unwrap_err()
                .to_string();
            assert!(err.to_lowercase().contains("io_engine"), "{err}");
            jail.set_env("LARDER_IO_ENGINE", "uring");
            jail.create_file(
                "two.toml",
                "[[disk_partitions]]\nname = \"a\"\ncapacity = \"1GiB\"\nbuckets = [\"x\"]\n\
                 [[disk_partitions]]\nname = \"b\"\ncapacity = \"1GiB\"\nbuckets = [\"x\"]\n",
            )?;
            let err = Config::load(Some(&jail.directory().join("two.toml")), Flags::default())
                .unwrap_err()
                .to_string();
            assert!(err.contains("mapped to two partitions"), "{err}");
            // An encryption key with no disk tier to encrypt is a mistake, not a no-op.
            jail.create_file("key.toml", "disk_encryption_key_file = \"/k\"\n")?;
            let err = Config::load(Some(&jail.directory().join("key.toml")), Flags::default())
                .unwrap_err()
                .to_string();
            assert!(err.contains("no disk tier to encrypt"), "{err}");
            // A key to rotate from with none to rotate to: refused, naming the option.
            jail.create_file(
                "previous.toml",
                "disk_path = \"/d\"\ndisk_encryption_previous_key_file = \"/k\"\n",
            )?;
            let err = Config::load(
                Some(&jail.directory().join("previous.toml")),
                Flags::default(),
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains("no key to rotate to"), "{err}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure must return figment's own error
    fn a_key_policy_takes_rates_and_refuses_ones_that_would_stall_it() {
        figment::Jail::expect_with(|jail| {
            let load = |text: &str| {
                let path = jail.directory().join("larder.toml");
                std::fs::write(&path, format!("auth_credentials = \"k\"\n{text}")).unwrap();
                Config::load(Some(&path), Flags::default()).map_err(|e| e.to_string())
            };
            let c = load(
                "[[auth_policies]]\naccess_key = \"batch\"\nrequests_per_second = 200\nbytes_per_second = \"50MiB\"\n",
            )
            .expect("loads");
            let policy = &c.auth_policies[0];
            assert_eq!(policy.requests_per_second.map(|r| r.get()), Some(200));
            assert_eq!(policy.bytes_per_second, Some(ByteSize(50 << 20)));
            // What --check-config prints loads back to the same policy.
            let printed = toml::to_string(&c).unwrap();
            assert!(
                printed.contains("bytes_per_second = \"50MiB\""),
                "{printed}"
            );
            for (text, want) in [
                ("requests_per_second = 0", "nonzero"),
                ("bytes_per_second = 512", "at least 1KiB"),
                ("requests_per_second = 1.5", "requests_per_second"),
            ] {
                let err =
                    load(&format!("[[auth_policies]]\naccess_key = \"a\"\n{text}\n")).unwrap_err();
                assert!(err.contains(want), "{text}: {err}");
            }
            let twice = "[[auth_policies]]\naccess_key = \"a\"\n[[auth_policies]]\naccess_key = \"a\"\nrequests_per_second = 5\n";
            let err = load(twice).unwrap_err();
            assert!(err.contains("\"a\" twice"), "{err}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure must return figment's own error
    fn auth_is_on_by_default_and_needs_keys() {
        figment::Jail::expect_with(|jail| {
            let err = Config::load(None, Flags::default())
                .unwrap_err()
                .to_string();
            assert!(err.contains("auth_credentials"), "{err}");
            jail.create_file(
                "larder.toml",
                r#"
auth_credentials = "/etc/larder/keys"
tls_cert = "/etc/larder/cert.pem"
tls_key = "/etc/larder/key.pem"

[[auth_policies]]
access_key = "analytics"
buckets = ["lake", "logs-*"]
access = "read-only"

[[auth_policies]]
access_key = "etl"
"#,
            )?;
            let path = jail.directory().join("larder.toml");
            let c = Config::load(Some(&path), Flags::default()).expect("loads");
            assert_eq!(c.auth, AuthMode::Sigv4);
            assert_eq!(c.auth_policies[0].access, crate::auth::Access::ReadOnly);
            assert_eq!(c.auth_policies[1].buckets, ["*"]);
            assert_eq!(c.auth_policies[1].access, crate::auth::Access::ReadWrite);
            jail.create_file("half.toml", "auth = \"none\"\ntls_cert = \"c.pem\"\n")?;
            let err = Config::load(Some(&jail.directory().join("half.toml")), Flags::default())
                .unwrap_err()
                .to_string();
            assert!(err.contains("tls_cert"), "{err}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure must return figment's own error
    fn fleet_tls_takes_all_three_files_and_a_fleet() {
        figment::Jail::expect_with(|jail| {
            let fleet = "auth = \"none\"\nfleet_peers = [\"a:1\"]\nfleet_secret_file = \"s\"\n";
            let tls = "fleet_tls_cert = \"c.pem\"\nfleet_tls_key = \"k.pem\"\n";
            let load = |name: &str, text: String| {
                jail.create_file(name, &text)?;
                Ok::<_, figment::Error>(Config::load(
                    Some(&jail.directory().join(name)),
                    Flags::default(),
                ))
            };
            let err = load("no-ca.toml", format!("{fleet}{tls}"))?
                .unwrap_err()
                .to_string();
            assert!(err.contains("must be set together"), "{err}");
            let all =
                format!("{tls}fleet_tls_ca = \"ca.pem\"\nfleet_tls_name = \"larder-fleet\"\n");
            let c = load("all.toml", format!("{fleet}{all}"))?.expect("loads");
            assert_eq!(c.fleet_tls_name.as_deref(), Some("larder-fleet"));
            let err = load("alone.toml", format!("auth = \"none\"\n{all}"))?
                .unwrap_err()
                .to_string();
            assert!(err.contains("not in a fleet"), "{err}");
            for (name, text) in [
                ("name.toml", fleet),
                ("name-alone.toml", "auth = \"none\"\n"),
            ] {
                let err = load(name, format!("{text}fleet_tls_name = \"x\"\n"))?
                    .unwrap_err()
                    .to_string();
                assert!(err.contains("`fleet_tls_name` needs"), "{err}");
            }
            Ok(())
        });
    }

    /// The rows of docs/configuration.md's option tables: key, flag cell, env cell, default cell.
    fn documented() -> Vec<[String; 4]> {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/configuration.md"
        ))
        .unwrap();
        doc.lines()
            .filter_map(|line| {
                let cells: Vec<&str> = line.split(" | ").collect();
                let key = cells.first()?.strip_prefix("| `")?.strip_suffix('`')?;
                (cells.len() >= 5)
                    .then(|| [key, cells[1], cells[2], cells[3]].map(|c| c.trim().to_owned()))
            })
            .collect()
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure must return figment's own error
    fn the_documented_example_loads_as_its_comments_say() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/configuration.md"
        ))
        .unwrap();
        let example = doc
            .split("## Example\n\n```toml\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("docs/configuration.md has an example");
        figment::Jail::expect_with(|jail| {
            jail.create_file("larder.toml", example)?;
            let path = jail.directory().join("larder.toml");
            let c = Config::load(Some(&path), Flags::default()).expect("the example loads");
            // A table's keys run to the next table: options written after one are its own.
            assert_eq!(c.disk_capacity, ByteSize(500 << 30));
            let batch = &c.auth_policies[1];
            assert_eq!(batch.requests_per_second.map(|r| r.get()), Some(200));
            assert_eq!(batch.bytes_per_second, Some(ByteSize(50 << 20)));
            Ok(())
        });
    }

    #[test]
    fn every_option_is_documented_with_its_flag_variable_and_default() {
        let rows = documented();
        let defaults = toml::Value::try_from(Config::default()).unwrap();
        let documented: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
        let declared: Vec<&str> = OPTIONS.iter().map(|o| o.name).collect();
        let mut sorted = (documented.clone(), declared.clone());
        sorted.0.sort_unstable();
        sorted.1.sort_unstable();
        assert_eq!(
            sorted.0, sorted.1,
            "docs/configuration.md and OPTIONS differ"
        );
        for o in OPTIONS {
            let [_, flag, env, default] =
                &rows[documented.iter().position(|d| *d == o.name).unwrap()];
            if o.flag == FlagKind::TomlOnly {
                assert!(flag.contains("TOML file only"), "{}: {flag}", o.name);
                continue;
            }
            let cell = |text: String| move |c: &String| c.starts_with(&text);
            assert!(
                cell(format!("`--{}`", o.name.replace('_', "-")))(flag),
                "{}: {flag}",
                o.name
            );
            assert!(
                cell(format!("`LARDER_{}`", o.name.to_uppercase()))(env),
                "{}: {env}",
                o.name
            );
            // The documented default, read as the flag would read it, is the declared one.
            match default
                .split('`')
                .nth(1)
                .filter(|_| !default.starts_with("none"))
            {
                Some(text) => {
                    let (k, v) = (o.name, text.to_owned());
                    // A list's default is every quoted item of the cell.
                    let value = match o.flag {
                        FlagKind::List => figment::value::Value::from(
                            default.split('`').skip(1).step_by(2).collect::<Vec<_>>(),
                        ),
                        _ => v.parse::<figment::value::Value>().unwrap(),
                    };
                    let from_doc = Figment::from(Serialized::defaults(Config::default()))
                        .merge(Serialized::default(k, value))
                        .extract::<Config>()
                        .unwrap_or_else(|e| panic!("{k}: documented default `{v}`: {e}"));
                    let from_doc = toml::Value::try_from(from_doc).unwrap();
                    assert_eq!(
                        from_doc.get(k),
                        defaults.get(k),
                        "{k}: documented default `{v}`"
                    );
                }
                None => assert!(
                    default.starts_with("none")
                        && defaults
                            .get(o.name)
                            .is_none_or(|v| v.as_array().is_some_and(|a| a.is_empty())),
                    "{}: documented default {default}, declared {:?}",
                    o.name,
                    defaults.get(o.name)
                ),
            }
        }
    }

    #[test]
    fn every_flag_but_the_toml_only_ones_exists() {
        use clap::Args;
        let cmd = Flags::augment_args(clap::Command::new("larder"));
        let mut flags: Vec<String> = cmd
            .get_arguments()
            .filter_map(|a| a.get_long().map(str::to_owned))
            .collect();
        let mut expected: Vec<String> = OPTIONS
            .iter()
            .filter(|o| o.flag != FlagKind::TomlOnly)
            .map(|o| o.name.replace('_', "-"))
            .collect();
        flags.sort_unstable();
        expected.sort_unstable();
        assert_eq!(flags, expected);
    }
}
