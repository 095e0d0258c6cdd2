//! Logs and traces through `tracing`: logs on stderr as text or JSON; with `otlp_endpoint`,
//! spans exported by OTLP, whole traces at a time and only for slow (or sampled) requests, so
//! the common fast request costs a few span allocations and nothing on the wire.

use std::collections::{HashMap, VecDeque};
use std::io::IsTerminal;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry::Context;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, SdkTracerProvider, Span, SpanData, SpanProcessor,
};
use parking_lot::Mutex;
use tracing_subscriber::filter::{filter_fn, FilterExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

use super::metrics::otlp_url;

/// How log lines are written (the `log_format` option).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// JSON objects, one per line.
    Json,
}

/// What logs and traces are set up with (from the configuration).
#[derive(Debug, Clone, Default)]
pub struct TraceOptions {
    /// How log lines are written.
    pub log_format: LogFormat,
    /// Whether log lines carry the fields of the spans they were written in.
    pub log_spans: bool,
    /// Where spans are exported by OTLP/HTTP; `None`: no traces.
    pub otlp_endpoint: Option<String>,
    /// A trace whose root span took at least this long is exported.
    pub slow_threshold: Duration,
    /// Share of the other traces exported too.
    pub sample_ratio: f64,
}

/// Most traces held while their request is running; beyond it new traces are not kept.
const MAX_OPEN_TRACES: usize = 4096;
/// Most spans held per trace.
const MAX_SPANS_PER_TRACE: usize = 256;

/// The filter of log lines in force (`RUST_LOG`'s syntax), changed without a restart through
/// the admin listener's `/log`: debug lines for one module while a problem is happening, then
/// back, without losing the memory tier to a restart.
#[derive(Clone)]
pub struct LogFilter {
    handle: reload::Handle<EnvFilter, Registry>,
    /// What is in force, as given (an `EnvFilter` does not print back what it was parsed from),
    /// and the number of the change that put it there.
    current: Arc<Mutex<(String, u64)>>,
    /// What was in force at start.
    initial: Arc<str>,
}

/// A filter that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("not a log filter: {0}")]
pub struct LogFilterError(String);

/// The process's log filter, once [`init`] installed the subscriber (which is process-wide).
static LOG_FILTER: OnceLock<LogFilter> = OnceLock::new();

/// The log filter [`init`] installed; `None` before it (or in tests, which never call it).
pub fn log_filter() -> Option<LogFilter> {
    LOG_FILTER.get().cloned()
}

impl LogFilter {
    /// The filter in force.
    pub fn current(&self) -> String {
        self.current.lock().0.clone()
    }

    /// The filter in force at start.
    pub fn initial(&self) -> &str {
        &self.initial
    }

    /// Put `directives` in force from the next line logged; refused, with the filter in force
    /// kept, if they do not parse. Returns the filter it replaced and the change's number, for
    /// [`LogFilter::reset_after`].
    pub fn set(&self, directives: &str) -> Result<(String, u64), LogFilterError> {
        let filter = EnvFilter::builder()
            .parse(directives)
            .map_err(|e| LogFilterError(e.to_string()))?;
        let mut current = self.current.lock();
        self.reload(filter)?;
        let was = std::mem::replace(&mut current.0, directives.to_owned());
        current.1 += 1;
        Ok((was, current.1))
    }

    /// Put the filter at start back in force if the one in force is still change `change`'s
    /// (a temporary filter running out); whether it did.
    pub fn reset_after(&self, change: u64) -> bool {
        let mut current = self.current.lock();
        if current.1 != change {
            return false;
        }
        // The filter at start parsed when it was put in force.
        if self.reload(EnvFilter::new(&*self.initial)).is_err() {
            return false;
        }
        current.0 = self.initial.to_string();
        current.1 += 1;
        true
    }

    fn reload(&self, filter: EnvFilter) -> Result<(), LogFilterError> {
        self.handle
            .reload(filter)
            .map_err(|e| LogFilterError(e.to_string()))?;
        // Crates logging through `log` (reqwest, under the OTLP exporter) are bridged by a
        // `LogTracer` whose level was fixed at start: raise or lower it with the rest.
        tracing_log::log::set_max_level(tracing_log::AsLog::as_log(
            &tracing::level_filters::LevelFilter::current(),
        ));
        Ok(())
    }
}

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("setting up traces: {0}")]
pub struct TelemetryError(String);

/// Keeps traces flowing until dropped; dropping it exports what is pending.
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(tracer) = self.tracer.take() {
            if let Err(e) = tracer.shutdown() {
                eprintln!("larder: exporting the last traces failed: {e}");
            }
        }
    }
}

/// Install the global `tracing` subscriber for `config`: the log format, `RUST_LOG` (default
/// `info`) and, with `otlp_endpoint`, the OTLP trace exporter.
pub fn init(config: &TraceOptions) -> Result<Telemetry, TelemetryError> {
    let tracer = match &config.otlp_endpoint {
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(otlp_url(endpoint, "traces"))
                .build()
                .map_err(|e| TelemetryError(e.to_string()))?;
            let processor = SlowTraces::new(
                BatchSpanProcessor::builder(exporter).build(),
                config.slow_threshold,
                config.sample_ratio,
            );
            Some(
                SdkTracerProvider::builder()
                    .with_resource(
                        opentelemetry_sdk::Resource::builder()
                            .with_service_name("larder")
                            .build(),
                    )
                    .with_span_processor(processor)
                    .build(),
            )
        }
        None => None,
    };
    let (subscriber, log_filter) = subscriber(config, tracer.as_ref());
    subscriber
        .try_init()
        .map_err(|e| TelemetryError(e.to_string()))?;
    let _ = LOG_FILTER.set(log_filter);
    Ok(Telemetry { tracer })
}

/// The log layer and, with a `tracer`, the span exporter's layer.
///
/// A span that no layer takes is never built, and then a request's spans cost one check per
/// callsite instead of an allocation each and the formatting of their fields (a tenth of a
/// 4 KiB hit's CPU, docs/benchmarks.md). So the log layer takes spans only with `log_spans`,
/// and the exporter's layer is left out, not added as an empty `Option`: `None` counts as a
/// layer that takes everything.
fn subscriber(
    config: &TraceOptions,
    tracer: Option<&SdkTracerProvider>,
) -> (Box<dyn tracing::Subscriber + Send + Sync>, LogFilter) {
    let log_spans = config.log_spans;
    // `RUST_LOG` when it parses, else `info`.
    let (parsed, initial) = std::env::var(EnvFilter::DEFAULT_ENV)
        .ok()
        .and_then(|d| Some((EnvFilter::builder().parse(&d).ok()?, d)))
        .unwrap_or_else(|| (EnvFilter::new("info"), "info".to_owned()));
    let (env, handle) = reload::Layer::new(parsed);
    let control = LogFilter {
        handle,
        current: Arc::new(Mutex::new((initial.clone(), 0))),
        initial: initial.into(),
    };
    let filter = env.and(filter_fn(move |meta| log_spans || !meta.is_span()));
    let logs = match config.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            // Colours for a person at a terminal only: in a file or a log collector the escape
            // codes are noise that breaks every grep.
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
    };
    let logged = tracing_subscriber::registry().with(logs);
    let subscriber: Box<dyn tracing::Subscriber + Send + Sync> = match tracer {
        // Spans are recorded at `info` whatever RUST_LOG says about log lines.
        Some(t) => Box::new(
            logged.with(
                tracing_opentelemetry::layer()
                    .with_tracer(t.tracer("larder"))
                    .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
            ),
        ),
        None => Box::new(logged),
    };
    (subscriber, control)
}

/// Keeps a trace's finished child spans until its root ends, then hands them all to the
/// exporter if the root was slow (or sampled), or drops them. A child that ends after its root
/// (a block fetch that outlives the response that started it) follows the root's decision.
#[derive(Debug)]
pub struct SlowTraces<P> {
    next: P,
    slow: Duration,
    sample: f64,
    traces: Mutex<Traces>,
}

#[derive(Debug, Default)]
struct Traces {
    /// Children of roots still running, in arrival order of their first child.
    open: HashMap<TraceId, Vec<SpanData>>,
    opened: VecDeque<TraceId>,
    /// Roots already decided (exported or not), most recent last.
    decided: HashMap<TraceId, bool>,
    decided_order: VecDeque<TraceId>,
}

impl Traces {
    fn hold(&mut self, trace: TraceId, span: SpanData) {
        if let Some(spans) = self.open.get_mut(&trace) {
            if spans.len() < MAX_SPANS_PER_TRACE {
                spans.push(span);
            }
            return;
        }
        // A root that never ends (a task that leaked its span) must not pin memory: the oldest
        // open trace gives way.
        if self.open.len() >= MAX_OPEN_TRACES {
            while let Some(old) = self.opened.pop_front() {
                if self.open.remove(&old).is_some() {
                    break;
                }
            }
        }
        self.open.insert(trace, vec![span]);
        self.opened.push_back(trace);
    }

    fn decide(&mut self, trace: TraceId, keep: bool) -> Vec<SpanData> {
        if self.decided_order.len() >= MAX_OPEN_TRACES {
            if let Some(old) = self.decided_order.pop_front() {
                self.decided.remove(&old);
            }
        }
        self.decided.insert(trace, keep);
        self.decided_order.push_back(trace);
        self.open.remove(&trace).unwrap_or_default()
    }
}

impl<P: SpanProcessor> SlowTraces<P> {
    /// Export through `next` the traces whose root took at least `slow`, and a `sample` share
    /// (0 to 1) of the others.
    pub fn new(next: P, slow: Duration, sample: f64) -> Self {
        Self {
            next,
            slow,
            sample,
            traces: Mutex::new(Traces::default()),
        }
    }

    fn keep(&self, root: &SpanData) -> bool {
        let took = root
            .end_time
            .duration_since(root.start_time)
            .unwrap_or_default();
        took >= self.slow || (self.sample > 0.0 && rand::random::<f64>() < self.sample)
    }
}

impl<P: SpanProcessor> SpanProcessor for SlowTraces<P> {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        let trace = span.span_context.trace_id();
        if span.parent_span_id != SpanId::INVALID {
            let mut traces = self.traces.lock();
            match traces.decided.get(&trace) {
                Some(true) => {
                    drop(traces);
                    self.next.on_end(span);
                }
                Some(false) => {}
                None => traces.hold(trace, span),
            }
            return;
        }
        let keep = self.keep(&span);
        let children = self.traces.lock().decide(trace, keep);
        if keep {
            for child in children {
                self.next.on_end(child);
            }
            self.next.on_end(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.next.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.next.shutdown_with_timeout(timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Span as _, TraceContextExt as _, Tracer as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SimpleSpanProcessor};

    fn provider(slow: Duration) -> (SdkTracerProvider, InMemorySpanExporter) {
        let exporter = InMemorySpanExporter::default();
        let processor = SlowTraces::new(SimpleSpanProcessor::new(exporter.clone()), slow, 0.0);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .build();
        (provider, exporter)
    }

    /// A root taking `root_takes` with one child ending before it and one after it.
    fn trace(provider: &SdkTracerProvider, root_takes: Duration) {
        let tracer = provider.tracer("test");
        let root = tracer.start("request");
        let cx = Context::current_with_span(root);
        let mut child = tracer.start_with_context("upstream", &cx);
        child.end();
        let mut late = tracer.start_with_context("late", &cx);
        std::thread::sleep(root_takes);
        cx.span().end();
        late.end();
    }

    #[test]
    fn spans_are_built_only_for_a_layer_that_takes_them() {
        let built = |config: &TraceOptions, tracer: Option<&SdkTracerProvider>| {
            tracing::subscriber::with_default(subscriber(config, tracer).0, || {
                !tracing::info_span!("request").is_disabled()
            })
        };
        let quiet = TraceOptions::default();
        assert!(!built(&quiet, None), "no layer takes spans");
        let logged = TraceOptions {
            log_spans: true,
            ..TraceOptions::default()
        };
        assert!(built(&logged, None), "log_spans");
        let (tracer, _) = provider(Duration::ZERO);
        assert!(built(&quiet, Some(&tracer)), "traces");
        // Log lines are written either way.
        tracing::subscriber::with_default(subscriber(&quiet, None).0, || {
            assert!(tracing::enabled!(tracing::Level::INFO));
        });
    }

    #[test]
    fn the_log_filter_changes_in_place_and_a_bad_one_changes_nothing() {
        let (subscriber, filter) = subscriber(&TraceOptions::default(), None);
        tracing::subscriber::with_default(subscriber, || {
            let debug = || tracing::enabled!(target: "larder::read", tracing::Level::DEBUG);
            filter.set("info").unwrap();
            assert!(!debug() && tracing::enabled!(tracing::Level::INFO));
            filter.set("info,larder::read=debug").unwrap();
            assert!(debug(), "the new filter is not in force");
            assert!(!tracing::enabled!(target: "hyper", tracing::Level::DEBUG));
            assert!(
                tracing::info_span!("request").is_disabled(),
                "a filter change built spans no layer takes"
            );
            let err = filter.set("larder=loud").unwrap_err().to_string();
            assert!(err.contains("not a log filter"), "{err}");
            assert_eq!(filter.current(), "info,larder::read=debug");
            assert!(debug(), "a refused filter changed the one in force");
            filter.set("warn").unwrap();
            assert!(!debug() && !tracing::enabled!(tracing::Level::INFO));
            // A temporary filter runs out only while no other change came after it.
            let (was, change) = filter.set("debug").unwrap();
            assert_eq!(was, "warn");
            let (_, later) = filter.set("info,larder::read=debug").unwrap();
            assert!(!filter.reset_after(change), "a later change was undone");
            assert!(debug());
            assert!(filter.reset_after(later));
            assert_eq!(filter.current(), filter.initial());
        });
    }

    #[test]
    fn exports_whole_slow_traces_and_drops_fast_ones() {
        let (provider, exporter) = provider(Duration::from_millis(50));
        trace(&provider, Duration::ZERO);
        assert!(exporter.get_finished_spans().unwrap().is_empty());
        trace(&provider, Duration::from_millis(60));
        let spans = exporter.get_finished_spans().unwrap();
        let names: Vec<_> = spans.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(names, ["upstream", "request", "late"]);
        assert_eq!(spans[0].parent_span_id, spans[1].span_context.span_id());
        assert_eq!(spans[2].parent_span_id, spans[1].span_context.span_id());
    }

    #[test]
    fn a_root_that_never_ends_does_not_pin_memory() {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        provider.tracer("t").start("x").end();
        let template = exporter.get_finished_spans().unwrap().remove(0);
        let mut traces = Traces::default();
        for i in 0..(MAX_OPEN_TRACES as u128 + 10) {
            traces.hold(TraceId::from(i + 1), template.clone());
        }
        assert_eq!(traces.open.len(), MAX_OPEN_TRACES);
        assert!(!traces.open.contains_key(&TraceId::from(1)));
    }
}
