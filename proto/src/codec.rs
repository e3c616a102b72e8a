//! How the generated services read the wire, so a malformed request is the caller's error.
//!
//! * [`WireCodec`] - tonic's prost codec, except that a message that does not decode (not
//!   protobuf, a string that is not UTF-8, another message type) is `INVALID_ARGUMENT` naming
//!   the expected message, not tonic's `INTERNAL`. The build script makes every generated
//!   client and server use it.
//! * [`SizeGuard`] - wraps a generated server whose decoding limit is
//!   [`MAX_REQUEST_BYTES`]: tonic refuses a larger message
//!   from its length prefix, before buffering it, with `OUT_OF_RANGE`; the guard answers that
//!   as `INVALID_ARGUMENT` naming the contract's limits instead.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::server::NamedService;
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

use crate::limits::{MAX_BRANCHES, MAX_PAYLOAD_BYTES, MAX_REQUEST_BYTES};

/// [`ProstCodec`] with decode errors answered as `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct WireCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for WireCodec<T, U> {
    fn default() -> Self {
        WireCodec { _pd: PhantomData }
    }
}

impl<T, U> Codec for WireCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = WireDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        WireDecoder(ProstCodec::<T, U>::default().decoder())
    }
}

/// The decoder of [`WireCodec`].
#[derive(Debug, Clone)]
pub struct WireDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default> Decoder for WireDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(src).map_err(|e| {
            Status::invalid_argument(format!(
                "the message is not a valid {}: {}",
                wire_name::<U>(),
                e.message()
            ))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

/// `dtx.v1.BeginRequest` for `dtx_proto::v1::BeginRequest`.
fn wire_name<U>() -> String {
    let rust = std::any::type_name::<U>();
    let name = rust.rsplit("::").next().unwrap_or(rust);
    format!("dtx.v1.{name}")
}

/// Answers tonic's "message too large" refusal as `INVALID_ARGUMENT` naming the contract's
/// limits; everything else passes through. Serve it in place of the server it wraps.
#[derive(Debug, Clone)]
pub struct SizeGuard<S> {
    inner: S,
}

impl<S> SizeGuard<S> {
    /// Wraps `inner`, a generated server configured with
    /// `.max_decoding_message_size(MAX_REQUEST_BYTES)`.
    pub fn new(inner: S) -> Self {
        SizeGuard { inner }
    }
}

impl<S: NamedService> NamedService for SizeGuard<S> {
    const NAME: &'static str = S::NAME;
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<tonic::body::Body>, Infallible>> + Send>>;

impl<S, B> tonic::codegen::Service<http::Request<B>> for SizeGuard<S>
where
    S: tonic::codegen::Service<
            http::Request<B>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        >,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(match response.extensions().get::<Status>() {
                Some(status) if is_too_large(status) => too_large(status).into_http(),
                _ => response,
            })
        })
    }
}

/// tonic's refusal of a message over the decoding limit (the handler never ran).
fn is_too_large(status: &Status) -> bool {
    status.code() == Code::OutOfRange
        && status
            .message()
            .starts_with("Error, decoded message length too large")
}

fn too_large(status: &Status) -> Status {
    // tonic says "... found N bytes, the limit is: M bytes"; keep N for the caller.
    let found = status
        .message()
        .split("found ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or("more than");
    Status::invalid_argument(format!(
        "the request is {found} bytes, larger than the limit of {MAX_REQUEST_BYTES} bytes for a \
         whole request (each payload at most {MAX_PAYLOAD_BYTES} bytes, at most {MAX_BRANCHES} \
         branches or steps)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_message_names_the_contract_limits() {
        let tonic = Status::out_of_range(
            "Error, decoded message length too large: found 20971569 bytes, the limit is: \
             12345 bytes",
        );
        assert!(is_too_large(&tonic));
        let ours = too_large(&tonic);
        assert_eq!(ours.code(), Code::InvalidArgument);
        assert!(ours.message().starts_with("the request is 20971569 bytes"));
        assert!(ours.message().contains("65536"), "{}", ours.message());
        assert!(!is_too_large(&Status::out_of_range("deadline too far")));
    }

    #[test]
    fn wire_names_are_the_proto_names() {
        assert_eq!(
            wire_name::<crate::v1::BeginRequest>(),
            "dtx.v1.BeginRequest"
        );
    }
}
