//! PIPE-1: the path of a relayed call between a host agent and a worker of its host: a
//! local Unix socket carrying length-prefixed protobuf frames, not an HTTP/2 stream
//! over TCP.
//!
//! Why: at 1,024 procs a call is one message in and one reply out for every worker, on
//! CPUs that all of a host's procs share; over gRPC each cost the worker's runtime
//! thread two wake-ups (the request, then the reply handed over by the actor's thread)
//! and loopback TCP's protocol work on both sides. On the pipe the call is read by an
//! idle actor's thread (PIPE-2, `pipe_in.rs`: no runtime watches the worker's end), and
//! the actor's own thread writes the reply to the socket (`PipeWriter::send`): no
//! runtime wake-up at all on the worker for a call, and no HTTP/2.
//!
//! The socket is in the abstract namespace of the host's network namespace, named
//! after the worker's TCP address ([`name_of`]), so the agent finds it from what it
//! already knows. It never leaves the host, so it carries no TLS; the agent's first
//! frame is the mesh token (`Bearer ...`, checked in constant time as the gRPC
//! service's), and a pipe that does not present it is closed. Any user of the host
//! may take an abstract name, so each end checks that the other runs as its own user
//! ([`same_user`]) before anything is sent: an agent never gives the token to another
//! user's socket that took the name first (it keeps gRPC, whose port the agent bound
//! itself). Frames: a 4-byte
//! little-endian length, then the message: `Calls` from the agent, `Replies` from the
//! worker (one reply each, written as it is made).
//!
//! A pipe is used only by the agent that opened it, for the calls it relays; it does
//! not resume (RESUME-1): on one host it breaks only when the worker ends, and the
//! agent's calls in flight then fail as lost (CLIENT-1), never sent twice. The
//! heartbeat's pings take the pipe too (PIPE-3); cancels, spawns and stops keep the
//! worker's gRPC service. `MONARCH_PIPE=0` in the agent's environment keeps relayed
//! calls and pings on gRPC.

use super::RpcError;
use crate::proto::v1::{Replies, Reply};
use crate::sync::lock;
use bytes::{Buf, Bytes, BytesMut};
use prost::Message;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Largest frame a pipe reads (the control plane's limit, and room for the frame).
pub const MAX_FRAME: usize = super::MAX_MESSAGE_BYTES + 64 * 1024;

/// The abstract socket name of the pipe of the worker serving at `addr` (`ip:port`).
pub fn name_of(addr: &str) -> String {
    format!("monarch-pipe/{addr}")
}

/// Whether the process at the other end of the Unix socket `fd` runs as this
/// process's user (`SO_PEERCRED`: for a connecting agent, the user of the process that
/// listens). An abstract name can be taken by any user of the host: an agent never
/// sends the token to a pipe another user serves, and a worker closes a pipe another
/// user opened.
pub fn same_user(fd: RawFd) -> bool {
    // SAFETY: `ucred` is plain data, filled in by getsockopt on a socket we hold, with
    // its size passed.
    unsafe {
        let mut cred: libc::ucred = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        let ok = libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        ) == 0;
        ok && cred.uid == libc::getuid()
    }
}

/// Whether relayed calls may take pipes (`MONARCH_PIPE=0` says no).
pub fn enabled() -> bool {
    std::env::var("MONARCH_PIPE").map_or(true, |v| v != "0")
}

/// `msg` as one frame.
pub fn frame<M: Message>(msg: &M) -> Bytes {
    let len = msg.encoded_len();
    let mut buf = BytesMut::with_capacity(4 + len);
    buf.extend_from_slice(&(len as u32).to_le_bytes());
    msg.encode(&mut buf).expect("a BytesMut grows as needed");
    buf.freeze()
}

/// Raw bytes (the hello) as one frame.
pub fn frame_bytes(body: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buf.extend_from_slice(body);
    buf.freeze()
}

/// A pipe's socket, registered with the runtime for reading only: a socket registered
/// for writing too wakes the runtime each time the peer reads what was written (the
/// kernel reports room to write again), one more wake-up per message on both ends.
pub type Socket = Arc<AsyncFd<UnixStream>>;

/// `stream` (non-blocking) as a pipe's [`Socket`]; call inside the runtime.
pub fn socket(stream: UnixStream) -> std::io::Result<Socket> {
    stream.set_nonblocking(true)?;
    // SAFETY: the `AsyncFd` owns the stream, whose descriptor stays open and the same
    // for as long as the `AsyncFd` lives.
    let fd = unsafe { AsyncFd::register_with_interest(stream, Interest::READABLE)? };
    Ok(Arc::new(fd))
}

/// A pipe's socket as its writer holds it: any open descriptor of it.
pub type Fd = Arc<dyn AsRawFd + Send + Sync>;

/// Reads a pipe's frames.
pub struct FrameReader {
    sock: Socket,
    buf: BytesMut,
}

impl FrameReader {
    /// A reader of `sock`.
    pub fn new(sock: Socket) -> Self {
        FrameReader {
            sock,
            buf: BytesMut::with_capacity(64 * 1024),
        }
    }

    /// The next frame's body; `None` at the end of the stream, an error for a frame over
    /// [`MAX_FRAME`], a stream that ends inside a frame, or a broken one.
    pub async fn next(&mut self) -> Result<Option<Bytes>, RpcError> {
        loop {
            if let Some(frame) = take_frame(&mut self.buf)? {
                return Ok(Some(frame));
            }
            let mut guard = self
                .sock
                .readable()
                .await
                .map_err(|e| RpcError::Io(e.to_string()))?;
            let buf = &mut self.buf;
            let room = buf.capacity() - buf.len();
            let read = guard.try_io(|s| read_into(s.get_ref().as_raw_fd(), buf));
            match read {
                Err(_would_block) => continue,
                Ok(Ok(0)) if self.buf.is_empty() => return Ok(None),
                Ok(Ok(0)) => return Err(RpcError::Io("the pipe ended inside a frame".into())),
                // A read short of the room took all the socket had: the readiness is
                // cleared now (one newer than this wait is kept), not by a second read
                // that hears `EAGAIN` (a system call per reply).
                Ok(Ok(n)) if n < room => guard.clear_ready(),
                Ok(Ok(_)) => {}
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(RpcError::Io(e.to_string())),
            }
        }
    }
}

/// Frames up to this size are copied out of the read buffer, which then stays this
/// reader's alone and is used again; larger ones are split off it without a copy.
/// Splitting every frame off left the buffer shared with the frame (whose decoded
/// payload lives on: a reply on its way to the caller), so the next read reserved a new
/// 64 KiB: a large `malloc` and `free` per call in every worker and per reply in its
/// agent (glibc consolidating its small chunks each time).
const COPY_UP_TO: usize = 16 * 1024;

/// The first whole frame's body in `buf`, taken out of it; `None` (with room reserved
/// for the rest) while the frame is not all there; an error for one over [`MAX_FRAME`].
pub fn take_frame(buf: &mut BytesMut) -> Result<Option<Bytes>, RpcError> {
    if buf.len() < 4 {
        buf.reserve(64 * 1024);
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_FRAME {
        return Err(RpcError::TooLarge {
            size: len,
            limit: MAX_FRAME,
        });
    }
    if buf.len() < 4 + len {
        buf.reserve(4 + len - buf.len());
        return Ok(None);
    }
    if len <= COPY_UP_TO {
        let frame = Bytes::copy_from_slice(&buf[4..4 + len]);
        buf.advance(4 + len);
        return Ok(Some(frame));
    }
    buf.advance(4);
    Ok(Some(buf.split_to(len).freeze()))
}

/// One `read` of `fd` into `buf`'s spare capacity: the bytes read (0 at the end of the
/// stream), or the error (`WouldBlock` when a non-blocking socket has nothing).
pub fn read_into(fd: RawFd, buf: &mut BytesMut) -> std::io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    // SAFETY: reads into the buffer's spare capacity, which `read` fills from the
    // start; only the bytes it reports are then marked as set.
    let n = unsafe { libc::read(fd, spare.as_mut_ptr() as *mut libc::c_void, spare.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `read` set these `n` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n as usize) };
    Ok(n as usize)
}

/// The writing end of a pipe, for any thread: a frame goes out at once, with one
/// non-blocking `send` from the calling thread, unless the socket is full or frames
/// wait before it; those wait in order for a thread of the runtime's blocking pool
/// that writes them as the socket takes them. Frames never interleave. Dropping the
/// writer ends the stream in its direction (the peer reads the end).
pub struct PipeWriter {
    sock: Fd,
    state: Arc<Mutex<WriteState>>,
}

#[derive(Default)]
struct WriteState {
    /// Frames (or the rest of one) not yet written, in order.
    queue: VecDeque<Bytes>,
    /// A blocking-pool thread is writing `queue`.
    flushing: bool,
    /// The peer is gone: frames are dropped.
    broken: bool,
}

enum Sent {
    All,
    Some(usize),
    Full,
    Broken,
}

/// One `send` of `buf` on `fd`, with `flags` (MSG_DONTWAIT: never waits).
fn send_on(fd: RawFd, buf: &[u8], flags: i32) -> Sent {
    // SAFETY: sends from a valid slice on a socket its `PipeWriter` holds open.
    let n = unsafe {
        libc::send(
            fd,
            buf.as_ptr() as *const libc::c_void,
            buf.len(),
            flags | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.kind() {
            std::io::ErrorKind::WouldBlock => Sent::Full,
            std::io::ErrorKind::Interrupted => Sent::Some(0),
            _ => Sent::Broken,
        };
    }
    if n as usize == buf.len() {
        Sent::All
    } else {
        Sent::Some(n as usize)
    }
}

impl PipeWriter {
    /// A writer of `sock` (a [`Socket`], or a socket no runtime watches: PIPE-2).
    pub fn new(sock: Fd) -> Arc<Self> {
        Arc::new(PipeWriter {
            sock,
            state: Arc::default(),
        })
    }

    /// Sends `frame` (made by [`frame`]) now or, if it cannot go at once, as soon as
    /// the socket has room; dropped if the peer has gone. Never blocks.
    pub fn send(&self, frame: Bytes) {
        let mut st = lock(&self.state);
        if st.broken {
            return;
        }
        if st.queue.is_empty() {
            let mut rest = frame;
            loop {
                match send_on(self.sock.as_raw_fd(), &rest, libc::MSG_DONTWAIT) {
                    Sent::All => return,
                    Sent::Some(n) => {
                        let _ = rest.split_to(n);
                    }
                    Sent::Full => break,
                    Sent::Broken => {
                        st.broken = true;
                        return;
                    }
                }
            }
            st.queue.push_back(rest);
        } else {
            st.queue.push_back(frame);
        }
        if !st.flushing {
            st.flushing = true;
            let (sock, state) = (self.sock.clone(), self.state.clone());
            crate::node::handle().spawn_blocking(move || flush(&sock, &state));
        }
    }
}

impl PipeWriter {
    /// Sends `reply` as a `Replies` frame of its own (the worker's end).
    pub fn send_reply(&self, reply: Reply) {
        self.send(frame(&Replies {
            replies: vec![reply],
            pong: None,
        }));
    }
}

impl Drop for PipeWriter {
    fn drop(&mut self) {
        // SAFETY: shuts down the sending side of a socket held open by `sock`.
        unsafe { libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_WR) };
    }
}

/// Writes the queued frames, waiting for the socket to take each (a blocking-pool
/// thread, only while the peer reads slower than frames come).
fn flush(sock: &Fd, state: &Mutex<WriteState>) {
    let fd = sock.as_raw_fd();
    loop {
        let front = {
            let mut st = lock(state);
            let Some(front) = st.queue.front().cloned() else {
                st.flushing = false; // (a frame sent from now on starts another flush)
                return;
            };
            front
        };
        // (blocking: the socket's other users send with MSG_DONTWAIT only while
        // nothing is queued, which is not now)
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: polls one valid pollfd that lives for the call.
        unsafe { libc::poll(&mut pfd, 1, 1000) };
        let sent = send_on(fd, &front, libc::MSG_DONTWAIT);
        let mut st = lock(state);
        match sent {
            Sent::All => {
                st.queue.pop_front();
            }
            Sent::Some(n) => {
                if let Some(f) = st.queue.front_mut() {
                    let _ = f.split_to(n);
                }
            }
            Sent::Full => {}
            Sent::Broken => {
                st.broken = true;
                st.queue.clear();
                st.flushing = false;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(buf: &mut BytesMut, body: &[u8]) {
        buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
        buf.extend_from_slice(body);
    }

    #[test]
    fn small_frames_are_copied_out_and_the_read_buffer_is_used_again() {
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let start = buf.as_ptr() as usize;
        let mut kept = Vec::new(); // (frames live on after they are taken: replies in flight)
        for i in 0..2_000u32 {
            let body = vec![i as u8; 100 + (i as usize % 7)];
            framed(&mut buf, &body);
            let frame = take_frame(&mut buf).unwrap().expect("a whole frame");
            assert_eq!(&frame[..], &body[..]);
            kept.push(frame);
            assert!(take_frame(&mut buf).unwrap().is_none()); // (reserves room for the next)
            assert_eq!(buf.as_ptr() as usize, start, "frame {i}: a new buffer");
        }
        let big = vec![7u8; COPY_UP_TO + 1];
        framed(&mut buf, &big);
        framed(&mut buf, b"after");
        assert_eq!(&take_frame(&mut buf).unwrap().unwrap()[..], &big[..]);
        assert_eq!(&take_frame(&mut buf).unwrap().unwrap()[..], b"after");
        assert!(take_frame(&mut buf).unwrap().is_none());
    }
}
