//! The dtx wire contract.
//!
//! * [`v1`] - code generated from `proto/dtx/v1/dtx.proto` (messages, the `Coordinator` and
//!   `Participant` services, their clients and servers).
//! * [`auth`] - who is calling: bearer tokens to the coordinator, its signed branch calls.
//! * [`answer`] - what a participant's answer proves (only an explicit FAILURE means "no
//!   effect"), one table for the coordinator and the SDK.
//! * [`limits`] - the input limits the contract documents, as code, so the coordinator, the
//!   participant server and the client SDK reject the same inputs with the same messages.
//! * [`http`] - the contract over HTTP/JSON: gRPC codes as HTTP statuses, problem bodies
//!   (the messages' proto3 JSON serde is generated into [`v1`]).
//! * [`reason`] - why a call failed, one stable name per cause, carried the same way by gRPC,
//!   HTTP/JSON, both SDKs and the CLI.
//! * [`codec`] - the codec of the generated code and the size guard of the servers, so
//!   malformed and oversized requests are INVALID_ARGUMENT with a message saying why.

pub mod answer;
pub mod auth;
pub mod backoff;
pub mod codec;
pub mod duration;
pub mod http;
pub mod limits;
pub mod present;
pub mod reason;
pub mod tls;
pub mod trace;

/// The branch id of a two-phase message's check-back calls, and of its slot in the
/// initiator's barrier table (one per message xid).
pub const MESSAGE_BRANCH: &str = "msg";

/// Generated code of package `dtx.v1`.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("dtx.v1");
    // serde of every message and enum in the proto3 JSON mapping.
    include!(concat!(env!("OUT_DIR"), "/dtx.v1.serde.rs"));

    /// Encoded `FileDescriptorSet` of the contract, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("dtx_descriptor");
}

impl v1::TxStatus {
    /// A terminal status never changes again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Committed | Self::RolledBack | Self::Succeeded | Self::Compensated
        )
    }

    /// Terminal, or parked until an operator acts: nothing more happens by itself.
    pub fn is_settled(self) -> bool {
        self.is_terminal() || self == Self::NeedsAttention
    }
}
