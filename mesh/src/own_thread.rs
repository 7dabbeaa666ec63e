//! The mesh on a thread of its own: a single-threaded Tokio runtime that
//! runs every mesh task (gossip, the QUIC endpoint and its connections,
//! rounds, pushes, sessions, housekeeping).
//!
//! Why: a push round wakes a chain of tasks (the rounds builder, one push
//! task per link, the QUIC connection drivers, the endpoint). On a shared
//! multi-threaded runtime those wakes are spread over its workers, and each
//! spread wakes a parked worker: a context switch that, under proxy load,
//! preempts the I/O threads serving requests. On one thread the chain runs
//! back to back after a single wake, and the change announcer is a task
//! on the same thread (timed by a timerfd, `gap_timer.rs`), so a round
//! under load costs one wake-up instead of three. The mesh's work is small
//! and sequential (the scale harness measures it on one thread), so one
//! thread loses nothing.

use tokio::sync::oneshot;

use crate::MeshError;
use crate::mesh::Mesh;

/// Keeps the mesh's thread and runtime alive while the [`Mesh`] lives:
/// dropping it lets the runtime end (its tasks are cancelled).
#[derive(Debug)]
pub(crate) struct OwnThread {
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for OwnThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // The thread is not joined (the drop may run on a runtime thread):
        // it ends on its own once its runtime has cancelled its tasks.
    }
}

impl Mesh {
    /// [`Mesh::start`] on a dedicated thread (`shoal-mesh`) with its own
    /// single-threaded runtime, so the mesh's wake-ups stay off the
    /// caller's runtime. The returned mesh is used from any runtime;
    /// dropping it (or [`Mesh::shutdown`]) ends the thread.
    pub async fn start_on_own_thread(config: crate::MeshConfig) -> Result<Mesh, MeshError> {
        let (started_tx, started_rx) = oneshot::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("shoal-mesh".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .thread_name("shoal-mesh")
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let error = MeshError::Io(format!("building the mesh runtime: {e}"));
                        let _ = started_tx.send(Err(error));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let started = Mesh::start(config).await;
                    let failed = started.is_err();
                    // A caller that gave up drops the mesh here, on its runtime.
                    if started_tx.send(started).is_err() || failed {
                        return;
                    }
                    let _ = stop_rx.await;
                });
            })
            .map_err(|e| MeshError::Io(format!("starting the mesh thread: {e}")))?;
        let mut mesh = started_rx
            .await
            .map_err(|_| MeshError::Io("the mesh thread ended while starting".into()))??;
        mesh.own_thread = Some(OwnThread {
            stop: Some(stop_tx),
        });
        Ok(mesh)
    }
}
