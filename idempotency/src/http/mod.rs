//! A tower layer for the `Idempotency-Key` request header (usable with axum, hyper, tonic-web).
//!
//! Wrap the *create* routes (POST/PATCH) with [`IdempotencyLayer`]. For every request with a key
//! it hashes method, path and body ([`crate::HashRules`] canonical JSON for JSON bodies),
//! claims the key in lease mode, calls the inner service only for the request that owns the
//! claim, and stores its status, the headers that matter and the body; repeats get that stored
//! response back. Safe methods (GET, HEAD, OPTIONS, TRACE) pass through untouched.
//!
//! | situation                                   | response                                        |
//! |---------------------------------------------|-------------------------------------------------|
//! | first request                               | the handler's response (e.g. 201), recorded     |
//! | repeat after SUCCEEDED / FAILED_FINAL       | the stored status, headers, body + `Idempotent-Replayed: true` |
//! | repeat while the first is running           | `202 Accepted` + `Retry-After` (or waits, see [`crate::Idempotency::wait`]) |
//! | repeat after FAILED_RETRYABLE               | runs again (re-claimed with a new owner token)  |
//! | same key, different method/path/body        | `409 Conflict`, the first result untouched      |
//! | lease expired, fact check could not tell    | `202 Accepted`, parked for a person             |
//! | key missing (when required) or malformed    | `400 Bad Request`                               |
//! | body larger than the limit                  | `413 Content Too Large`                         |
//! | idempotency store unavailable               | `503 Service Unavailable` + `Retry-After`; the handler did not run |
//! | a new key past the tenant's limit ([`IdempotencyLayer::limit_new_keys`]) | `429 Too Many Requests` + `Retry-After`; nothing stored |
//!
//! Error bodies are `application/problem+json` (RFC 9457).
//!
//! # Where this differs from the IETF httpapi Idempotency-Key draft, and why
//!
//! * **Different payload for a used key: 409, not 422.** 422 already means "your body failed
//!   validation" in most APIs, and a client fixing its body would retry with the same key and
//!   keep failing. The key is bound to a state that conflicts with the request: 409 is that.
//! * **Concurrent request while the first is in flight: 202 + `Retry-After`, not 409.** The
//!   first request was accepted and is being processed; a client should come back later with
//!   the same key. Answering 409 would make "wait and retry with this key" indistinguishable
//!   from "this key is used for something else, never retry it" above.
//! * **Missing key: 400**, like the draft (not 422: nothing about the body is wrong).
//! * **Key syntax:** the draft defines the value as a Structured Field String (`"..."`); we
//!   accept that and the bare form most clients send (`Idempotency-Key: 8e03978e-...`), limited
//!   to 64 bytes of `[A-Za-z0-9._:-]` (UUIDs fit) so a header can never inject anything into the
//!   key or blow up the index. The draft leaves the format to the server.
//! * **Replays** repeat the stored status, body and a configurable list of headers
//!   (`Content-Type`, `Location`, `Content-Location`, `ETag` by default) and add
//!   `Idempotent-Replayed: true`; the draft only says "the result of the previously completed
//!   operation". `Date`, cookies and per-attempt headers are not replayed.
//! * **Errors are recorded too**: a final 4xx is replayed to repeats (the draft's "success or an
//!   error"); 408, 425, 429 and 503 are retryable failures the next request runs again; any
//!   other 5xx is *unknown* (the handler may have committed before failing): repeats get 202
//!   until the lease expires and the fact check decides. A handler that knows better inserts an
//!   [`Outcome`] into its response extensions.
//!
//! The key is scoped by the layer's operation scope and by the tenant your authentication
//! established ([`IdempotencyLayer::tenant`]), so two clients' equal keys never meet.
//!
//! # Hot keys and abuse (the seed's section on hot idempotency keys)
//!
//! * **Authentication runs first.** Put your authentication layer *outside* this one (with
//!   axum: `.layer(idempotency).layer(auth)`, the last added runs first), so an anonymous or
//!   refused request never creates a record, and have it insert the caller's tenant into the
//!   request extensions for [`IdempotencyLayer::tenant`].
//! * **New keys are limited per tenant** ([`IdempotencyLayer::limit_new_keys`]); repeats of
//!   existing keys are not, so a client retrying is never locked out by its own retries.
//! * **A repeat of a key still in progress is answered at once** (`202` + `Retry-After`, the
//!   owner's remaining lease): the claim is a short transaction of its own, never a wait on the
//!   owner's row lock, so a storm of repeats on one hot key costs one indexed read each.
//! * Every database conversation of the layer runs to its end on a task of its own, so a
//!   client that disconnects cannot leave a pooled connection out of step.
//!
//! While the handler runs, the layer renews the lease every third of it
//! ([`crate::Lease::keep_alive`]), so a slow handler keeps its record and repeats get 202 until
//! it answers. A client that disconnects mid-request drops the handler future and with it the
//! renewal; the record then stays PROCESSING until its lease expires and the fact check runs -
//! exactly like a crash.

mod envelope;
mod layer;
mod problem;

use http::header::HeaderName;

pub use layer::{IdempotencyLayer, IdempotencyService, Outcome};

/// The request header carrying the key.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Set on every replayed response.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// Longest accepted client key, in bytes.
pub const MAX_CLIENT_KEY_LEN: usize = 64;
/// Default limit of a buffered request body.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1024 * 1024;
