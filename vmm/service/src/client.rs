//! A small HTTP/1.1 client over the service's Unix socket (hyper), for
//! `tiervm ctl` and the tests. Every request is bounded in time.

use std::path::Path;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::Request;
use hyper_util::rt::TokioIo;

/// A request to the service failed before it answered.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached.
    #[error("connecting to {path}: is tiervm serve running? (give its --socket)")]
    Connect {
        /// The socket.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// HTTP failed.
    #[error("the request")]
    Http(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// An answer.
#[derive(Clone, Debug)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// Content type.
    pub content_type: String,
    /// Body.
    pub body: Vec<u8>,
}

impl Answer {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request (`body` as JSON when given) and waits up to `timeout`.
pub fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<Answer, ClientError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ClientError::Http(Box::new(e)))?;
    rt.block_on(async {
        tokio::time::timeout(timeout, send(socket, method, path, body))
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
    })
}

async fn send(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> Result<Answer, ClientError> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|source| ClientError::Connect {
            path: socket.display().to_string(),
            source,
        })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ClientError::Http(Box::new(e)))?;
    let conn = tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "localhost");
    if body.is_some() {
        req = req.header(hyper::header::CONTENT_TYPE, "application/json");
    }
    let req = req
        .body(Full::new(Bytes::copy_from_slice(body.unwrap_or_default())))
        .map_err(|e| ClientError::Http(Box::new(e)))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| ClientError::Http(Box::new(e)))?;
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| ClientError::Http(Box::new(e)))?
        .to_bytes()
        .to_vec();
    conn.abort();
    Ok(Answer {
        status,
        content_type,
        body,
    })
}
