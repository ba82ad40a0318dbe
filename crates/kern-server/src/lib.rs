//! kern-server: the OpenAI-compatible HTTP API over `kern-engine` (axum + tokio).
//!
//! `POST /v1/completions`, `POST /v1/chat/completions` (both streaming as SSE or not),
//! `GET /v1/models`, `GET /health`, `GET /version`, `POST /tokenize`, `POST /detokenize`,
//! `GET /metrics`. Structured output (`response_format`, `structured_outputs`), tools
//! (`tools`, `tool_choice`; calls parsed from the model's own format) and reasoning blocks
//! (`reasoning_content`). Requests are parsed into checked values (`protocol`), turned into engine
//! requests (one per prompt × `n`), and their events into OpenAI's JSON. Errors become HTTP
//! statuses in one place (`error`). A handler dropped mid-way — a client that disconnects —
//! drops its request handles, which aborts the requests and frees their KV pages.
//!
//! Startup binds first and answers `/health` with 503 until the engine is ready; SIGTERM (or
//! the `shutdown` future) drains: new requests get 503, running ones finish, then the server
//! exits. If the engine fails (a GPU fault), the requests in flight get 500 naming the op and
//! [`serve`] returns [`Outcome::EngineFailed`] so the process exits non-zero.

mod api;
mod chat_out;
mod error;
pub mod protocol;
pub mod reasoning;
mod structured;
pub mod tools;

pub use error::ApiError;
pub use protocol::SamplingDefaults;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use kern_engine::{Engine, State};
use kern_tokenizer::{ChatTemplate, Tokenizer};
use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// How the server presents the model.
pub struct ServerConfig {
    /// Names clients may use in `model`; the first is the one reported.
    pub served_model_names: Vec<String>,
    /// Required as `Authorization: Bearer KEY` on `/v1/*`, `/tokenize`, `/detokenize`.
    pub api_key: Option<String>,
    /// Most alternatives per token a request may ask for.
    pub max_logprobs: usize,
    /// Sampling values for fields a request leaves unset.
    pub defaults: SamplingDefaults,
    /// The chat template (None: chat requests are refused with a message saying why).
    pub chat_template: Option<ChatTemplate>,
    /// The model's root (reported by `/v1/models`).
    pub root: String,
    /// Largest request body accepted; a larger one gets 413 in OpenAI's error shape.
    pub max_body_bytes: usize,
    /// The model's tool-call format (None: requests with tools, other than `tool_choice: none`,
    /// are refused). `tools::detect` reads it from the chat template.
    pub tool_format: Option<Arc<dyn tools::ToolFormat>>,
    /// Whether the model writes a `<think>` reasoning block, returned apart as
    /// `reasoning_content` (`reasoning::detect` reads it from the chat template).
    pub reasoning: bool,
}

/// [`ServerConfig::max_body_bytes`] of `kern serve`: 64 MiB (a 128k-token prompt as token ids
/// with logit bias and tools is far below it).
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 << 20;

pub(crate) struct Shared {
    pub engine: Engine,
    pub tok: Option<Arc<Tokenizer>>,
    pub cfg: ServerConfig,
    pub created: u64,
    pub draining: AtomicBool,
}

/// The server's state, shared by every handler.
#[derive(Clone)]
pub struct AppState(pub(crate) Arc<Shared>);

impl AppState {
    pub fn new(engine: Engine, tok: Option<Arc<Tokenizer>>, cfg: ServerConfig) -> AppState {
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        AppState(Arc::new(Shared { engine, tok, cfg, created, draining: AtomicBool::new(false) }))
    }

    pub fn engine(&self) -> &Engine {
        &self.0.engine
    }
}

/// Every route.
pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/completions", post(api::completions))
        .route("/v1/chat/completions", post(api::chat))
        .route("/v1/models", get(api::models))
        .route("/tokenize", post(api::tokenize))
        .route("/detokenize", post(api::detokenize))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), api::auth));
    Router::new()
        .merge(v1)
        .route("/health", get(api::health))
        .route("/version", get(api::version))
        .route("/metrics", get(api::metrics))
        .fallback(api::not_found)
        .layer(DefaultBodyLimit::max(state.0.cfg.max_body_bytes))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(api::panic_response))
        .with_state(state)
}

/// How [`serve`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Shut down on request after the running requests finished.
    Drained,
    /// The engine failed (model load or a step); the process should exit non-zero.
    EngineFailed(String),
}

/// Serves until `shutdown` resolves (then drains) or the engine fails.
pub async fn serve(listener: tokio::net::TcpListener, state: AppState, shutdown: impl Future<Output = ()> + Send + 'static) -> std::io::Result<Outcome> {
    let engine = state.engine().clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let watcher_state = state.clone();
    tokio::spawn(async move {
        let mut st = engine.subscribe();
        let failed = async {
            loop {
                if matches!(*st.borrow_and_update(), State::Failed | State::Stopped) {
                    return;
                }
                if st.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            _ = shutdown => {
                watcher_state.0.draining.store(true, std::sync::atomic::Ordering::SeqCst);
                engine.drain();
                let mut st = engine.subscribe();
                while !matches!(*st.borrow_and_update(), State::Stopped | State::Failed) {
                    if st.changed().await.is_err() { break; }
                }
            }
            _ = failed => {}
        }
        let _ = stop_tx.send(());
    });
    let app = router(state.clone());
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stop_rx.await;
                let _ = done_tx.send(());
            })
            .await
    });
    // After the signal, connections get a grace period to finish their last bytes.
    let grace = async {
        let _ = done_rx.await;
        tokio::time::sleep(Duration::from_secs(10)).await;
    };
    tokio::select! {
        r = server => { r.map_err(std::io::Error::other)??; }
        _ = grace => {}
    }
    Ok(match state.engine().state() {
        State::Failed => Outcome::EngineFailed(state.engine().failure().unwrap_or_else(|| "the engine failed".into())),
        _ => Outcome::Drained,
    })
}
