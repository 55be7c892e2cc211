//! A TCP fault proxy for tests: it sits between one client (a `solocron run` node) and a
//! real server (a store), forwards bytes, and fails the way networks fail when the test
//! says so, at run time, without touching the server.
//!
//! ```no_run
//! use solocron_conformance::proxy::{FaultProxy, Mode};
//!
//! let proxy = FaultProxy::start("127.0.0.1:5432".parse().unwrap()).unwrap();
//! let url = format!("postgres://postgres@127.0.0.1:{}/test", proxy.port());
//! // ... start a node on `url` ...
//! proxy.set_mode(Mode::Blackhole); // a partition: nothing refused, nothing answered
//! proxy.set_mode(Mode::Pass); // healed
//! ```
//!
//! [`Mode::Blackhole`] stops *reading*, so what a client sent during the partition stays in
//! the kernel's buffers and in the proxy's and is delivered when the proxy passes again, as
//! TCP's retransmissions would deliver it after a real partition heals: a stream is never
//! cut in the middle by a blackhole. [`Mode::DropReplies`] does cut it (the replies are
//! gone, and the connection is reset when the proxy passes again), as a connection lost
//! between a server's commit and its answer would be.
//!
//! The proxy runs on a thread of its own with its own single-threaded Tokio runtime, so
//! a synchronous test drives it with plain calls; dropping the [`FaultProxy`] stops the
//! thread and closes every connection.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Most client connections open through one proxy at once; a connection beyond it is
/// closed at once (reset), as a server at its connection limit would. A connection
/// accepted during a blackhole keeps its slot until the mode changes, even if its client
/// gave up: a long partition with a client that keeps reconnecting can reach the bound
/// (see [`FaultProxy::open_connections`]).
pub const MAX_CONNECTIONS: usize = 128;

/// Bytes read from one side before they are written to the other (per direction, per
/// connection): what a blackholed direction holds besides the kernel's buffers.
pub const BUFFER_BYTES: usize = 16 * 1024;

/// Longest wait for the target to accept a connection; past it the client's connection is
/// reset.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What the proxy does with connections, switchable at any time with
/// [`FaultProxy::set_mode`]; a switch applies at once to open connections too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forwards both ways (the initial mode).
    Pass,
    /// A host that is down: a new connection is accepted and reset at once, an open one is
    /// reset (both to the client and to the target).
    Refuse,
    /// A partition: connections stay open and new ones are accepted, but nothing is
    /// forwarded either way (and a new connection is not forwarded to the target) until the
    /// mode changes. What was sent meanwhile is held, and delivered after a switch to
    /// [`Mode::Pass`] or [`Mode::DropReplies`].
    Blackhole,
    /// Client-to-server bytes are forwarded; server-to-client bytes are read and thrown
    /// away (a request is carried out, its answer never arrives). A connection that lost
    /// bytes so is reset when the mode next lets bytes through ([`Mode::Pass`]), since
    /// TCP never delivers a stream with a hole: it is a connection cut between the
    /// server's work and its answer. One that lost nothing goes on.
    DropReplies,
}

/// One way bytes travel through a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Client to server.
    Request,
    /// Server to client.
    Reply,
}

/// What a direction does with its bytes under a mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Forward,
    Discard,
    Hold,
    Reset,
}

impl Mode {
    fn flow(self, dir: Direction) -> Flow {
        match (self, dir) {
            (Mode::Pass, _) | (Mode::DropReplies, Direction::Request) => Flow::Forward,
            (Mode::DropReplies, Direction::Reply) => Flow::Discard,
            (Mode::Blackhole, _) => Flow::Hold,
            (Mode::Refuse, _) => Flow::Reset,
        }
    }
}

/// A running fault proxy on `127.0.0.1` (an ephemeral port) in front of one target.
pub struct FaultProxy {
    addr: SocketAddr,
    mode: Arc<watch::Sender<Mode>>,
    open: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy in [`Mode::Pass`] forwarding to `target`, listening on
    /// `127.0.0.1:0` (see [`addr`](Self::addr)).
    pub fn start(target: SocketAddr) -> std::io::Result<FaultProxy> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let mode = Arc::new(watch::Sender::new(Mode::Pass));
        let open = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let shared = Shared { target, mode: mode.clone(), open: open.clone() };
        let thread = std::thread::Builder::new().name(format!("fault-proxy-{}", addr.port())).spawn(move || {
            runtime.block_on(async move {
                let listener = match TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => return eprintln!("fault proxy: cannot listen: {e}"),
                };
                tokio::select! {
                    () = accept_loop(listener, shared) => {}
                    _ = stopped => {}
                }
            });
            // Dropping the runtime cancels every connection's task, closing its sockets.
        })?;
        Ok(FaultProxy { addr, mode, open, stop: Some(stop), thread: Some(thread) })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to (the host is `127.0.0.1`).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Switches the mode; open connections follow at once.
    pub fn set_mode(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }

    /// Client connections open through the proxy now.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What every connection's task shares with the proxy.
#[derive(Clone)]
struct Shared {
    target: SocketAddr,
    mode: Arc<watch::Sender<Mode>>,
    open: Arc<AtomicUsize>,
}

/// Counts one open connection while it lives.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    /// A slot for one more connection, or `None` at [`MAX_CONNECTIONS`].
    fn slot(&self) -> Option<Slot> {
        let taken =
            self.open.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < MAX_CONNECTIONS).then_some(n + 1));
        taken.ok().map(|_| Slot(self.open.clone()))
    }
}

async fn accept_loop(listener: TcpListener, shared: Shared) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(e) => {
                // Out of descriptors, for instance: wait a little rather than spin.
                eprintln!("fault proxy: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Refused connections are reset by their task, which looks at the mode first.
        let Some(slot) = shared.slot() else {
            reset(client);
            continue;
        };
        tokio::spawn(connection(client, shared.clone(), slot));
    }
}

/// Closes `stream` with a reset (RST) rather than an orderly close.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// One client connection: connected to the target once the mode lets bytes through, then
/// both directions pumped until each ends or the mode says reset.
async fn connection(mut client: TcpStream, shared: Shared, _slot: Slot) {
    let mut mode = shared.mode.subscribe();
    // A blackholed connection is not forwarded: the target sees it only after the heal.
    let Ok(Mode::Pass | Mode::DropReplies) = mode.wait_for(|m| *m != Mode::Blackhole).await.map(|m| *m) else {
        return reset(client);
    };
    let mut server = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(shared.target)).await {
        Ok(Ok(server)) => server,
        _ => return reset(client),
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let outcome = {
        let (mut client_read, mut client_write) = client.split();
        let (mut server_read, mut server_write) = server.split();
        let requests = pump(&mut client_read, &mut server_write, Direction::Request, shared.mode.subscribe());
        let replies = pump(&mut server_read, &mut client_write, Direction::Reply, shared.mode.subscribe());
        tokio::try_join!(requests, replies)
    };
    if outcome.is_err() {
        reset(client);
        reset(server);
    }
}

/// Why a direction stopped with the connection to be reset.
struct Cut;

/// Copies one direction as the mode says until its reader ends (then shuts the writer
/// down: a half close); `Err` when the connection must be reset: the mode is
/// [`Mode::Refuse`], either side failed, or bytes were thrown away ([`Mode::DropReplies`])
/// and the mode now lets bytes through again (a stream with a hole cannot go on).
async fn pump<R, W>(from: &mut R, to: &mut W, dir: Direction, mut mode: watch::Receiver<Mode>) -> Result<(), Cut>
where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let mut buf = vec![0u8; BUFFER_BYTES];
    let mut holed = false;
    loop {
        if flowing(&mut mode, dir).await? == Flow::Forward && holed {
            return Err(Cut);
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => read.map_err(|_| Cut)?,
            // A switch while waiting for bytes: look at the new mode first (a blackhole
            // must stop reading at once, not after the next read).
            changed = mode.changed() => { changed.map_err(|_| Cut)?; continue; }
        };
        if n == 0 && holed {
            return Err(Cut);
        }
        if n == 0 {
            let _ = to.shutdown().await;
            return Ok(());
        }
        // The mode may have changed while reading: what was read goes by the new one.
        match flowing(&mut mode, dir).await? {
            Flow::Forward if holed => return Err(Cut),
            Flow::Forward => tokio::select! {
                written = to.write_all(&buf[..n]) => written.map_err(|_| Cut)?,
                refused = mode.wait_for(|m| m.flow(dir) == Flow::Reset) => { let _ = refused; return Err(Cut); }
            },
            Flow::Discard | Flow::Hold | Flow::Reset => holed = true,
        }
    }
}

/// Waits while the mode holds this direction; the flow to apply, or `Err` to reset.
async fn flowing(mode: &mut watch::Receiver<Mode>, dir: Direction) -> Result<Flow, Cut> {
    let now = mode.wait_for(|m| m.flow(dir) != Flow::Hold).await.map_err(|_| Cut)?.flow(dir);
    match now {
        Flow::Reset => Err(Cut),
        flow => Ok(flow),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{ErrorKind, Read, Write};
    use std::net::{Shutdown, TcpListener as StdListener, TcpStream as StdStream};

    /// How long a test waits for bytes that must not come.
    const SILENCE: Duration = Duration::from_millis(300);
    /// How long a test waits for bytes (or a reset) that must come.
    const PROMPTLY: Duration = Duration::from_secs(3);

    /// A tiny echo server on a thread per connection, counting what reaches it.
    struct Echo {
        addr: SocketAddr,
        accepted: Arc<AtomicUsize>,
        received: Arc<AtomicUsize>,
    }

    impl Echo {
        fn start() -> Echo {
            let listener = StdListener::bind(("127.0.0.1", 0)).unwrap();
            let addr = listener.local_addr().unwrap();
            let (accepted, received) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
            let (a, r) = (accepted.clone(), received.clone());
            // Lives as long as the test binary: one thread, and one per connection made.
            std::thread::spawn(move || {
                for conn in listener.incoming().flatten() {
                    a.fetch_add(1, Ordering::SeqCst);
                    let r = r.clone();
                    std::thread::spawn(move || echo(conn, &r));
                }
            });
            Echo { addr, accepted, received }
        }

        fn accepted(&self) -> usize {
            self.accepted.load(Ordering::SeqCst)
        }

        fn received(&self) -> usize {
            self.received.load(Ordering::SeqCst)
        }
    }

    fn echo(mut conn: StdStream, received: &AtomicUsize) {
        let mut buf = [0u8; 1024];
        while let Ok(n) = conn.read(&mut buf) {
            if n == 0 || conn.write_all(&buf[..n]).is_err() {
                break;
            }
            received.fetch_add(n, Ordering::SeqCst);
        }
    }

    fn connect(proxy: &FaultProxy) -> StdStream {
        let s = StdStream::connect(proxy.addr()).unwrap();
        s.set_read_timeout(Some(SILENCE)).unwrap();
        s
    }

    /// What one read gives within `within`: bytes, end of stream, or nothing (timeout).
    #[derive(Debug, PartialEq)]
    enum Got {
        Bytes(Vec<u8>),
        Closed,
        Nothing,
    }

    fn read(s: &mut StdStream, within: Duration) -> Got {
        s.set_read_timeout(Some(within)).unwrap();
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(0) => Got::Closed,
            Ok(n) => Got::Bytes(buf[..n].to_vec()),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Got::Nothing,
            Err(_) => Got::Closed, // a reset
        }
    }

    /// Reads until `want` bytes came (echoes may arrive in pieces).
    fn read_exactly(s: &mut StdStream, want: usize) -> Vec<u8> {
        let mut got = Vec::new();
        while got.len() < want {
            match read(s, PROMPTLY) {
                Got::Bytes(b) => got.extend(b),
                other => panic!("expected {want} bytes, got {got:?} then {other:?}"),
            }
        }
        got
    }

    fn wait_until(what: &str, f: impl Fn() -> bool) {
        let until = std::time::Instant::now() + PROMPTLY;
        while !f() {
            assert!(std::time::Instant::now() < until, "{what}: not within {PROMPTLY:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn pass_forwards_both_ways_and_a_half_close() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(echo.addr).unwrap();
        let mut s = connect(&proxy);
        s.write_all(b"hello").unwrap();
        assert_eq!(read_exactly(&mut s, 5), b"hello");
        s.shutdown(Shutdown::Write).unwrap();
        assert_eq!(read(&mut s, PROMPTLY), Got::Closed, "the server's close comes through");
        wait_until("the connection is released", || proxy.open_connections() == 0);
    }

    #[test]
    fn refuse_resets_open_connections_and_new_ones() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(echo.addr).unwrap();
        let mut open = connect(&proxy);
        open.write_all(b"a").unwrap();
        assert_eq!(read_exactly(&mut open, 1), b"a");
        proxy.set_mode(Mode::Refuse);
        assert_eq!(read(&mut open, PROMPTLY), Got::Closed, "an open connection is cut");
        let mut new = connect(&proxy);
        let _ = new.write_all(b"b");
        assert_eq!(read(&mut new, PROMPTLY), Got::Closed, "a new connection is closed at once");
        assert_eq!(echo.accepted(), 1, "the new connection never reached the server");
        wait_until("every connection is released", || proxy.open_connections() == 0);
        proxy.set_mode(Mode::Pass);
        let mut again = connect(&proxy);
        again.write_all(b"c").unwrap();
        assert_eq!(read_exactly(&mut again, 1), b"c", "passes again after");
    }

    #[test]
    fn blackhole_forwards_nothing_either_way_then_delivers_what_it_held() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(echo.addr).unwrap();
        let mut open = connect(&proxy);
        open.write_all(b"1").unwrap();
        assert_eq!(read_exactly(&mut open, 1), b"1");
        proxy.set_mode(Mode::Blackhole);
        open.write_all(b"2").unwrap();
        let mut new = connect(&proxy);
        new.write_all(b"3").unwrap();
        assert_eq!(read(&mut open, SILENCE), Got::Nothing, "no answer on an open connection");
        assert_eq!(read(&mut new, SILENCE), Got::Nothing, "no answer, and no reset, on a new one");
        assert_eq!(echo.received(), 1, "nothing reached the server");
        assert_eq!(echo.accepted(), 1, "a new connection is not forwarded");
        assert_eq!(proxy.open_connections(), 2, "both stay open");
        proxy.set_mode(Mode::Pass);
        assert_eq!(read_exactly(&mut open, 1), b"2", "held bytes are delivered after the heal");
        assert_eq!(read_exactly(&mut new, 1), b"3");
        assert_eq!(echo.accepted(), 2);
    }

    #[test]
    fn drop_replies_forwards_requests_discards_answers_and_then_resets_the_cut_connections() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(echo.addr).unwrap();
        let mut s = connect(&proxy);
        let mut quiet = connect(&proxy);
        quiet.write_all(b"q").unwrap();
        assert_eq!(read_exactly(&mut quiet, 1), b"q");
        proxy.set_mode(Mode::DropReplies);
        s.write_all(b"ping").unwrap();
        wait_until("the request reaches the server", || echo.received() == 5);
        assert_eq!(read(&mut s, SILENCE), Got::Nothing, "the answer is thrown away");
        let mut new = connect(&proxy);
        new.write_all(b"pong").unwrap();
        wait_until("a new connection's request reaches the server", || echo.received() == 9);
        assert_eq!(read(&mut new, SILENCE), Got::Nothing);
        proxy.set_mode(Mode::Pass);
        assert_eq!(read(&mut s, PROMPTLY), Got::Closed, "a connection that lost answers is reset");
        assert_eq!(read(&mut new, PROMPTLY), Got::Closed);
        quiet.write_all(b"!").unwrap();
        assert_eq!(read_exactly(&mut quiet, 1), b"!", "one that lost nothing goes on");
    }

    #[test]
    fn connections_beyond_the_bound_are_reset() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(echo.addr).unwrap();
        let held: Vec<StdStream> = (0..MAX_CONNECTIONS).map(|_| connect(&proxy)).collect();
        wait_until("every connection is open", || proxy.open_connections() == MAX_CONNECTIONS);
        let mut over = connect(&proxy);
        let _ = over.write_all(b"o");
        assert_eq!(read(&mut over, PROMPTLY), Got::Closed, "one more is reset");
        drop(held);
        wait_until("the slots are released", || proxy.open_connections() == 0);
        let mut s = connect(&proxy);
        s.write_all(b"k").unwrap();
        assert_eq!(read_exactly(&mut s, 1), b"k");
    }

    #[test]
    fn dropping_the_proxy_closes_its_connections() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(echo.addr).unwrap();
        let mut s = connect(&proxy);
        s.write_all(b"q").unwrap();
        assert_eq!(read_exactly(&mut s, 1), b"q");
        drop(proxy);
        assert_eq!(read(&mut s, PROMPTLY), Got::Closed);
    }
}
