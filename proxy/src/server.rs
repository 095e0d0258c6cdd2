//! Wiring: build the caches from the configuration, bind both listeners, serve until shut down.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cache_core::BlockLayout;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, AdminState};
use crate::blocks::{BlockStore, BlockStoreConfig};
use crate::config::Config;
use crate::metadata::MetadataCache;
use crate::metrics::Metrics;
use crate::origin::Origin;
use crate::routes::{self, AppState};

/// A running Larder.
pub struct Running {
    /// Where the S3 listener is bound.
    pub s3_addr: SocketAddr,
    /// Where the admin listener is bound.
    pub admin_addr: SocketAddr,
    /// Its metrics.
    pub metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<std::io::Result<()>>>,
}

/// Bind the listeners and start serving in front of `origin`.
pub async fn start(config: &Config, origin: Arc<dyn Origin>) -> std::io::Result<Running> {
    let metrics = Arc::new(Metrics::default());
    let block_config = BlockStoreConfig {
        layout: BlockLayout::new(config.block_size.0),
        memory_capacity: config.memory_capacity.0,
        read_window: config.read_window,
        idle_timeout: config.upstream_idle_timeout.0,
        upstream_concurrency: config.upstream_concurrency,
    };
    let blocks = Arc::new(BlockStore::new(
        block_config,
        origin.clone(),
        metrics.clone(),
    ));
    let app = Arc::new(AppState {
        base_domain: config.base_domain.clone(),
        metadata: MetadataCache::new(
            origin.clone(),
            config.metadata_ttl.0,
            config.metadata_capacity,
            metrics.clone(),
        ),
        blocks: blocks.clone(),
        origin,
        metrics: metrics.clone(),
    });
    let admin_state = Arc::new(AdminState {
        metrics: metrics.clone(),
        blocks,
        ready: AtomicBool::new(false),
    });

    let s3_listener = TcpListener::bind(config.listen).await?;
    let admin_listener = TcpListener::bind(config.admin_listen).await?;
    let (s3_addr, admin_addr) = (s3_listener.local_addr()?, admin_listener.local_addr()?);
    let shutdown = CancellationToken::new();
    let tasks = vec![
        tokio::spawn(
            axum::serve(s3_listener, routes::router(app).into_make_service())
                .with_graceful_shutdown(shutdown.clone().cancelled_owned())
                .into_future(),
        ),
        tokio::spawn(
            axum::serve(
                admin_listener,
                admin::router(admin_state.clone()).into_make_service(),
            )
            .with_graceful_shutdown(shutdown.clone().cancelled_owned())
            .into_future(),
        ),
    ];
    admin_state.ready.store(true, Ordering::Release);
    tracing::info!(%s3_addr, %admin_addr, block_size = %config.block_size, memory_capacity = %config.memory_capacity, "larder is serving");
    Ok(Running {
        s3_addr,
        admin_addr,
        metrics,
        shutdown,
        tasks,
    })
}

impl Running {
    /// Stop accepting connections, let responses in progress finish, and return.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        self.wait().await;
    }

    /// Serve until shut down (or a listener fails).
    pub async fn wait(self) {
        for task in self.tasks {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "listener failed"),
                Err(e) => tracing::error!(error = %e, "listener task panicked"),
            }
        }
    }

    /// A handle that shuts this Larder down when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}
