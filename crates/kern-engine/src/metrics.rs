//! The engine's metrics, exposed in Prometheus' text format by `kern serve` at `/metrics`.
//! Names follow vLLM's (`vllm/v1/metrics/loggers.py`) with a `kern:` prefix where the meaning is
//! the same; counters get `_total` when exposed. Intervals use one monotonic clock; TTFT, queue
//! and end-to-end times count from the request's arrival at the server.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

type Labels = Vec<(String, String)>;

pub struct Metrics {
    registry: Mutex<Registry>,
    pub running: Gauge,
    pub waiting: Gauge,
    pub kv_used_pages: Gauge,
    pub kv_total_pages: Gauge,
    pub kv_usage: Gauge<f64, AtomicU64>,
    pub prompt_tokens: Counter,
    pub generation_tokens: Counter,
    pub preemptions: Counter,
    pub prefix_queries: Counter,
    pub prefix_hits: Counter,
    pub cached_pages: Gauge,
    pub spec_drafts: Counter,
    pub spec_draft_tokens: Counter,
    pub spec_accepted: Counter,
    pub spec_draft_steps: Counter,
    pub host_hits: Counter,
    pub stored_pages: Counter,
    pub restored_pages: Counter,
    pub snapshots_saved: Counter,
    pub snapshots_restored: Counter,
    pub snapshots_evicted: Counter,
    pub restore_bytes: Counter,
    pub restore_secs: Counter<f64, AtomicU64>,
    pub steps: Counter,
    pub success: Family<Labels, Counter>,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub queue_time: Histogram,
    pub iteration_tokens: Histogram,
    pub prompt_len: Histogram,
    pub generation_len: Histogram,
    pub mask_secs: Histogram,
    pub mask_wait_secs: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let m = Metrics {
            registry: Mutex::new(Registry::default()),
            running: Gauge::default(),
            waiting: Gauge::default(),
            kv_used_pages: Gauge::default(),
            kv_total_pages: Gauge::default(),
            kv_usage: Gauge::default(),
            prompt_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            preemptions: Counter::default(),
            prefix_queries: Counter::default(),
            prefix_hits: Counter::default(),
            cached_pages: Gauge::default(),
            spec_drafts: Counter::default(),
            spec_draft_tokens: Counter::default(),
            spec_accepted: Counter::default(),
            spec_draft_steps: Counter::default(),
            host_hits: Counter::default(),
            stored_pages: Counter::default(),
            restored_pages: Counter::default(),
            snapshots_saved: Counter::default(),
            snapshots_restored: Counter::default(),
            snapshots_evicted: Counter::default(),
            restore_bytes: Counter::default(),
            restore_secs: Counter::default(),
            steps: Counter::default(),
            success: Family::default(),
            // 1 ms … ~2600 s
            ttft: Histogram::new(exponential_buckets(0.001, 2.0, 22)),
            // 1 ms … ~80 s
            itl: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            // 10 ms … ~5000 s
            e2e: Histogram::new(exponential_buckets(0.01, 2.0, 20)),
            queue_time: Histogram::new(exponential_buckets(0.001, 2.0, 22)),
            iteration_tokens: Histogram::new(exponential_buckets(1.0, 2.0, 15)),
            prompt_len: Histogram::new(exponential_buckets(1.0, 2.0, 18)),
            generation_len: Histogram::new(exponential_buckets(1.0, 2.0, 18)),
            // 10 µs … ~0.6 s
            mask_secs: Histogram::new(exponential_buckets(1e-5, 2.0, 17)),
            mask_wait_secs: Histogram::new(exponential_buckets(1e-5, 2.0, 17)),
        };
        {
            let mut r = m.registry.lock().expect("fresh lock");
            r.register("kern:num_requests_running", "Requests in the running batch (holding KV pages)", m.running.clone());
            r.register("kern:num_requests_waiting", "Requests queued, new or preempted", m.waiting.clone());
            r.register("kern:kv_cache_used_pages", "KV pages held by running requests", m.kv_used_pages.clone());
            r.register("kern:kv_cache_total_pages", "KV pages in the pool", m.kv_total_pages.clone());
            r.register("kern:kv_cache_usage_perc", "Fraction of KV pages in use, 0 to 1", m.kv_usage.clone());
            r.register("kern:prompt_tokens", "Prompt tokens of admitted requests", m.prompt_tokens.clone());
            r.register("kern:generation_tokens", "Generated tokens", m.generation_tokens.clone());
            r.register("kern:num_preemptions", "Requests preempted (pages freed, recomputed later)", m.preemptions.clone());
            r.register("kern:engine_steps", "Steps run", m.steps.clone());
            r.register("kern:prefix_cache_queries", "Prompt tokens looked up in the prefix cache", m.prefix_queries.clone());
            r.register("kern:prefix_cache_hits", "Prompt tokens found in the prefix cache (not computed)", m.prefix_hits.clone());
            r.register("kern:external_prefix_cache_hits", "Prompt tokens found in the host tier (a subset of prefix_cache_hits)", m.host_hits.clone());
            r.register("kern:kv_offload_stored_pages", "KV pages copied to host memory", m.stored_pages.clone());
            r.register("kern:kv_offload_restored_pages", "KV pages copied back from host memory", m.restored_pages.clone());
            r.register("kern:prefix_cache_snapshots_saved", "Snapshots of per-sequence states kept at page boundaries of cached prefixes", m.snapshots_saved.clone());
            r.register("kern:prefix_cache_snapshots_restored", "Snapshots of per-sequence states copied into a sequence at a prefix hit", m.snapshots_restored.clone());
            r.register("kern:prefix_cache_snapshots_evicted", "Snapshots dropped with their page or as least recently used", m.snapshots_evicted.clone());
            r.register("kern:kv_offload_restored_bytes", "Bytes copied back from host memory", m.restore_bytes.clone());
            r.register("kern:kv_offload_restore_seconds", "GPU time of the copies back from host memory", m.restore_secs.clone());
            r.register("kern:spec_decode_num_drafts", "Sequence-steps that verified draft tokens", m.spec_drafts.clone());
            r.register("kern:spec_decode_num_draft_tokens", "Draft tokens proposed", m.spec_draft_tokens.clone());
            r.register("kern:spec_decode_num_accepted_tokens", "Draft tokens accepted", m.spec_accepted.clone());
            r.register("kern:spec_decode_num_draft_steps", "Steps of the draft program run", m.spec_draft_steps.clone());
            r.register("kern:kv_cache_cached_pages", "KV pages holding a cached prefix (in use or free)", m.cached_pages.clone());
            r.register("kern:request_success", "Finished requests by finish reason", m.success.clone());
            r.register("kern:time_to_first_token_seconds", "Time from arrival to the first generated token", m.ttft.clone());
            r.register("kern:inter_token_latency_seconds", "Time between successive tokens of a request", m.itl.clone());
            r.register("kern:e2e_request_latency_seconds", "Time from arrival to the last token", m.e2e.clone());
            r.register("kern:request_queue_time_seconds", "Time from arrival to the first step that computes the request", m.queue_time.clone());
            r.register("kern:iteration_tokens_total", "Tokens per engine step", m.iteration_tokens.clone());
            r.register("kern:request_prompt_tokens", "Prompt tokens per request", m.prompt_len.clone());
            r.register("kern:request_generation_tokens", "Generated tokens per request", m.generation_len.clone());
            r.register("kern:token_mask_seconds", "CPU time of one constrained row's token mask (on a mask thread)", m.mask_secs.clone());
            r.register("kern:token_mask_wait_seconds", "Time a step waited for its token masks after it was scheduled (steps with constrained rows)", m.mask_wait_secs.clone());
        }
        m
    }

    pub fn finished(&self, reason: &str) {
        self.success.get_or_create(&vec![("finished_reason".to_string(), reason.to_string())]).inc();
    }

    /// The Prometheus / OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Writing to a String cannot fail.
        let _ = encode(&mut s, &r);
        s
    }
}
