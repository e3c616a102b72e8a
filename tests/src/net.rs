//! Real gRPC servers on port 0.

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::server::Router;
use tonic::transport::server::TcpIncoming;

/// A server running in the background; stops when dropped.
pub struct RunningServer {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl RunningServer {
    /// `http://127.0.0.1:<port>`, what a client or the coordinator dials.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting, lets in-flight calls finish, and waits for the server task.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            stop.send(()).ok();
        }
        if let Some(task) = self.task.take() {
            task.await.ok();
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop.send(()).ok();
        }
    }
}

/// Serves `router` on a fresh loopback port.
pub async fn serve(router: Router) -> RunningServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let addr = listener.local_addr().expect("local addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        router
            .serve_with_incoming_shutdown(
                TcpIncoming::from(listener).with_nodelay(Some(true)),
                async {
                    stopped.await.ok();
                },
            )
            .await
            .expect("grpc server");
    });
    RunningServer {
        addr,
        stop: Some(stop),
        task: Some(task),
    }
}
