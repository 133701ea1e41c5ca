//! The reactor with an echo connection: accept hand-off across reactors, edge-triggered
//! reads, EPOLLOUT arming, io_uring completion routing by token, close, and drain on stop.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;

use transport::conn::ConnStatus::{Closed, Open};

use storage::{BlockOp, BlockOpKind};

use super::*;

/// Echoes bytes; a `F` byte submits an fdatasync on `file` and answers `C<result>` when
/// its completion arrives.
struct Echo {
    stream: TcpStream,
    token: u32,
    file: Arc<std::fs::File>,
    out: Vec<u8>,
    inflight: usize,
    next_slot: u32,
}

impl Echo {
    fn boxed(stream: TcpStream, token: u32, file: &Arc<std::fs::File>) -> Conn {
        Box::new(Echo {
            stream,
            token,
            file: Arc::clone(file),
            out: Vec::new(),
            inflight: 0,
            next_slot: 0,
        })
    }
}

impl Connection for Echo {
    fn fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
    fn on_readable(&mut self, io: &mut dyn IoSubmit) -> ConnStatus {
        let mut buf = [0u8; 4096];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return Closed,
                Ok(n) => {
                    for &b in &buf[..n] {
                        if b == b'F' {
                            let tag = (u64::from(self.token) << 32) | u64::from(self.next_slot);
                            self.next_slot += 1;
                            self.inflight += 1;
                            let op = BlockOp {
                                fd: self.file.as_raw_fd(),
                                file: None,
                                kind: BlockOpKind::Flush,
                                offset: 0,
                                buf: std::ptr::null_mut(),
                                len: 0,
                            };
                            io.submit(op, tag);
                        } else {
                            self.out.push(b);
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Open,
                Err(_) => return Closed,
            }
        }
    }
    fn on_writable(&mut self) -> ConnStatus {
        while !self.out.is_empty() {
            match self.stream.write(&self.out) {
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Open,
                Err(_) => return Closed,
            }
        }
        Open
    }
    fn on_io_complete(&mut self, tag: u64, result: i32, _io: &mut dyn IoSubmit) -> ConnStatus {
        assert_eq!(
            tag >> 32,
            u64::from(self.token),
            "completion routed to the wrong connection"
        );
        self.inflight -= 1;
        self.out.extend_from_slice(format!("C{result}").as_bytes());
        Open
    }
    fn on_tick(&mut self, _now: Instant, _io: &mut dyn IoSubmit) -> ConnStatus {
        Open
    }
    fn wants_write(&self) -> bool {
        !self.out.is_empty()
    }
    fn inflight_ops(&self) -> usize {
        self.inflight
    }
    fn on_disconnected(&mut self) -> ConnStatus {
        Closed
    }
    fn shut_down(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

fn exchange(client: &mut TcpStream, send: &[u8], expect: &[u8]) {
    client.write_all(send).unwrap();
    let mut got = vec![0u8; expect.len()];
    client.read_exact(&mut got).unwrap();
    assert_eq!(got, expect);
}

/// A non-blocking listening socket on an ephemeral loopback port, and its address.
fn loopback_socket() -> (TcpListener, SocketAddr) {
    let socket = TcpListener::bind("127.0.0.1:0").unwrap();
    socket.set_nonblocking(true).unwrap();
    let address = socket.local_addr().unwrap();
    (socket, address)
}

/// A plain TCP listener of port `port_id` on NUMA node `node`, on a loopback port.
fn loopback_listener(port_id: u16, node: Option<u32>) -> (Listener, SocketAddr) {
    let (socket, address) = loopback_socket();
    let listener = Listener {
        socket,
        port_id,
        tls: None,
        node,
    };
    (listener, address)
}

/// `(reactor, that reactor's load)` as each connection was set up, in the order set up.
type Setups = Arc<std::sync::Mutex<Vec<(usize, usize)>>>;

/// Reactor threads (one per handle) of echo connections sharing `control`, the listeners
/// on reactor 0; each connection set up is logged in `setups`.
fn spawn_echo_reactors(
    handles: Vec<(Arc<ReactorHandle>, Receiver<Inbound>)>,
    listeners: Vec<Listener>,
    control: &Arc<Control>,
    file: &Arc<std::fs::File>,
    setups: &Setups,
) -> Vec<std::thread::JoinHandle<()>> {
    let peers: Vec<_> = handles.iter().map(|(h, _)| Arc::clone(h)).collect();
    let mut listeners = Some(listeners);
    let mut threads = Vec::new();
    for (id, (h, rx)) in handles.into_iter().enumerate() {
        let (peers, control, file) = (peers.clone(), Arc::clone(control), Arc::clone(file));
        let (own, setups) = (Arc::clone(&h), Arc::clone(setups));
        let listeners = if id == 0 {
            listeners.take().unwrap()
        } else {
            Vec::new()
        };
        threads.push(std::thread::spawn(move || {
            let engine = UringEngine::new(64).expect("io_uring");
            let factory: ConnectionFactory = Box::new(move |a: Accepted, token| {
                setups.lock().unwrap().push((id, own.load()));
                Ok(Echo::boxed(a.stream, token, &file))
            });
            Reactor::new(
                id,
                h,
                rx,
                peers,
                control,
                listeners,
                Vec::new(),
                engine,
                factory,
            )
            .unwrap()
            .run();
        }));
    }
    threads
}

#[test]
fn serves_connections_on_two_reactors_and_drains_on_stop() {
    let (listener, address) = loopback_listener(1, None);
    let file = Arc::new(tempfile());
    let control = Arc::new(Control::default());
    let (h0, rx0) = handle().unwrap();
    let (h1, rx1) = handle().unwrap();
    let setups = Setups::default();
    let threads = spawn_echo_reactors(
        vec![(Arc::clone(&h0), rx0), (Arc::clone(&h1), rx1)],
        vec![listener],
        &control,
        &file,
        &setups,
    );

    let mut clients: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(address).unwrap())
        .collect();
    for client in &mut clients {
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        exchange(client, b"hello", b"hello");
        exchange(client, b"F", b"C0");
    }
    // Equal loads rotate: three connections over two reactors.
    assert_eq!(h0.connections.load(Ordering::Relaxed), 2);
    assert_eq!(h1.connections.load(Ordering::Relaxed), 1);
    // Every connection counts on its reactor while it is set up (pending until counted):
    // reactor 0's first and third at loads 1 and 2, the second, handed to reactor 1, at 1.
    // Were the handed-over one not counted in that window, an accept then would see
    // reactor 1 empty and pick it again.
    let mut seen = setups.lock().unwrap().clone();
    seen.sort_unstable();
    assert_eq!(seen, [(0, 1), (0, 2), (1, 1)]);

    // A peer that goes away is closed and released.
    let wait_for = |n0: usize, n1: usize| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while h0.connections.load(Ordering::Relaxed) != n0
            || h1.connections.load(Ordering::Relaxed) != n1
        {
            assert!(Instant::now() < deadline, "closed connection not released");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    drop(clients.pop());
    wait_for(1, 1);
    // Placement by load, not turn: with reactor 0 empty the next connection goes there
    // although round-robin would pick reactor 1.
    drop(clients.remove(0));
    wait_for(0, 1);
    let mut client = TcpStream::connect(address).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    exchange(&mut client, b"hi", b"hi");
    clients.push(client);
    assert_eq!(h0.connections.load(Ordering::Relaxed), 1);
    assert_eq!(h1.connections.load(Ordering::Relaxed), 1);
    // Ticks advance the heartbeat.
    let beat = h0.heartbeat.load(Ordering::Relaxed);
    std::thread::sleep(TICK * 3);
    assert!(h0.heartbeat.load(Ordering::Relaxed) > beat);

    let stopping = Instant::now();
    control.stop.store(true, Ordering::Release);
    h0.wake();
    h1.wake();
    for thread in threads {
        thread.join().unwrap();
    }
    assert!(
        stopping.elapsed() < DRAIN_TIMEOUT,
        "idle connections should close at once"
    );
    // The server closed the remaining connections and the listener.
    for client in &mut clients {
        let mut byte = [0u8; 1];
        assert_eq!(client.read(&mut byte).unwrap_or(0), 0);
    }
    assert!(TcpStream::connect(address).is_err());
}

/// A port whose NIC is on node 1 has its connections served only by the node-1 reactor,
/// although the listener's own reactor (node 0) stays idle; with the port's node unknown
/// the same reactors share the load again.
#[test]
fn a_port_on_a_node_places_on_that_nodes_reactor() {
    let file = Arc::new(tempfile());
    let control = Arc::new(Control::default());
    let (h0, rx0) = handle().unwrap();
    let (h1, rx1) = handle().unwrap();
    h0.set_node(0);
    h1.set_node(1);
    let mut addresses = Vec::new();
    let mut listeners = Vec::new();
    for (port_id, node) in [(1, Some(1)), (2, None)] {
        let (listener, address) = loopback_listener(port_id, node);
        addresses.push(address);
        listeners.push(listener);
    }
    let setups = Setups::default();
    let threads = spawn_echo_reactors(
        vec![(Arc::clone(&h0), rx0), (Arc::clone(&h1), rx1)],
        listeners,
        &control,
        &file,
        &setups,
    );
    let connect = |address| {
        let mut client = TcpStream::connect(address).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        exchange(&mut client, b"hi", b"hi");
        client
    };
    let load = |h: &ReactorHandle| h.connections.load(Ordering::Relaxed);
    let mut clients: Vec<TcpStream> = (0..3).map(|_| connect(addresses[0])).collect();
    assert_eq!((load(&h0), load(&h1)), (0, 3), "node-1 port off its node");
    // The port with no node known: by load over both, so reactor 0 takes the next two.
    clients.push(connect(addresses[1]));
    clients.push(connect(addresses[1]));
    assert_eq!((load(&h0), load(&h1)), (2, 3));
    control.stop.store(true, Ordering::Release);
    h0.wake();
    h1.wake();
    for thread in threads {
        thread.join().unwrap();
    }
    drop(clients);
}

#[test]
fn output_beyond_the_socket_buffer_is_finished_later_intact() {
    let (listener, address) = loopback_listener(1, None);
    let file = Arc::new(tempfile());
    let control = Arc::new(Control::default());
    let (h0, rx0) = handle().unwrap();
    let setups = Setups::default();
    let threads = spawn_echo_reactors(
        vec![(Arc::clone(&h0), rx0)],
        vec![listener],
        &control,
        &file,
        &setups,
    );
    let mut client = TcpStream::connect(address).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // 16 MiB sent before reading anything: far more than both socket buffers, so the echo
    // backs up on EAGAIN and the reactor must finish it later (EPOLLOUT, or a tick's
    // opportunistic write) without losing or reordering a byte.
    let data: Vec<u8> = (0..16u32 << 20).map(|i| (i % 251) as u8 & !b'F').collect();
    let writer = {
        let mut client = client.try_clone().unwrap();
        let data = data.clone();
        std::thread::spawn(move || client.write_all(&data).unwrap())
    };
    std::thread::sleep(Duration::from_millis(300));
    let mut back = vec![0u8; data.len()];
    client.read_exact(&mut back).unwrap();
    writer.join().unwrap();
    assert!(back == data, "echoed bytes differ");
    control.stop.store(true, Ordering::Release);
    h0.wake();
    for thread in threads {
        thread.join().unwrap();
    }
}

/// Who set up which connection request, and each reactor's acceptor "hang-up" eventfd.
#[derive(Debug, Default)]
struct Placements {
    accepted: Vec<(usize, u32)>,
    acceptors: Vec<(usize, Arc<EventFd>)>,
}

/// An event listener that takes TCP sockets itself and hands them out as connection
/// requests, like rdma_cm: the reactor chosen by load sets each one up, and its acceptor
/// (an eventfd the test writes to, as rdma_cm reports DISCONNECTED on the serving
/// reactor's channel) reports that reactor's connections gone.
struct SelfAccepting {
    socket: TcpListener,
    file: Arc<std::fs::File>,
    placements: Arc<std::sync::Mutex<Placements>>,
    /// Set when the reactor drops the listener.
    dropped: Arc<AtomicBool>,
}

impl SelfAccepting {
    fn new(
        socket: TcpListener,
        file: &Arc<std::fs::File>,
        placements: &Arc<std::sync::Mutex<Placements>>,
    ) -> Self {
        SelfAccepting {
            socket,
            file: Arc::clone(file),
            placements: Arc::clone(placements),
            dropped: Arc::default(),
        }
    }
}

impl Drop for SelfAccepting {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::Release);
    }
}

impl EventListener for SelfAccepting {
    fn fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
    fn port_id(&self) -> u16 {
        9
    }
    fn address(&self) -> SocketAddr {
        self.socket.local_addr().unwrap()
    }
    fn node(&self) -> Option<u32> {
        None
    }
    fn on_event(&mut self, out: &mut Vec<ListenerOutput>) {
        while let Ok((stream, _)) = self.socket.accept() {
            stream.set_nonblocking(true).unwrap();
            out.push(ListenerOutput::Request(Box::new(TcpRequest {
                stream,
                file: Arc::clone(&self.file),
                placements: Arc::clone(&self.placements),
            })));
        }
    }
}

#[derive(Debug)]
struct TcpRequest {
    stream: TcpStream,
    file: Arc<std::fs::File>,
    placements: Arc<std::sync::Mutex<Placements>>,
}

impl PendingConnection for TcpRequest {
    fn port_id(&self) -> u16 {
        9
    }
    fn accept(
        self: Box<Self>,
        acceptor: &mut Option<Box<dyn Acceptor>>,
        place: Placement,
        token: u32,
    ) -> Option<Conn> {
        assert_ne!(token, 0, "token 0 is reserved");
        assert!(place.reactor < place.reactors);
        let mut placements = self.placements.lock().unwrap();
        if acceptor.is_none() {
            let hang_up = Arc::new(EventFd::from_flags(EfdFlags::EFD_NONBLOCK).expect("eventfd"));
            placements
                .acceptors
                .push((place.reactor, Arc::clone(&hang_up)));
            *acceptor = Some(Box::new(HangUp {
                hang_up,
                tokens: Vec::new(),
            }));
        }
        let side = acceptor.as_mut()?.as_any().downcast_mut::<HangUp>()?;
        side.tokens.push(token);
        placements.accepted.push((place.reactor, token));
        Some(Echo::boxed(self.stream, token, &self.file))
    }
}

struct HangUp {
    hang_up: Arc<EventFd>,
    tokens: Vec<u32>,
}

impl Acceptor for HangUp {
    fn fd(&self) -> BorrowedFd<'_> {
        self.hang_up.as_fd()
    }
    fn on_event(&mut self, disconnected: &mut Vec<u32>) {
        if self.hang_up.read().is_ok() {
            disconnected.append(&mut self.tokens);
        }
    }
    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn connection_requests_are_set_up_on_the_least_loaded_reactor() {
    let (socket, address) = loopback_socket();
    let file = Arc::new(tempfile());
    let placements = Arc::new(std::sync::Mutex::new(Placements::default()));
    let control = Arc::new(Control::default());
    let (h0, rx0) = handle().unwrap();
    let (h1, rx1) = handle().unwrap();
    let peers = vec![Arc::clone(&h0), Arc::clone(&h1)];
    let mut listener = Some(SelfAccepting::new(socket, &file, &placements));
    let mut threads = Vec::new();
    for (id, (h, rx)) in [(Arc::clone(&h0), rx0), (Arc::clone(&h1), rx1)]
        .into_iter()
        .enumerate()
    {
        let peers = peers.clone();
        let control = Arc::clone(&control);
        // The listener lives on reactor 1: placement does not favour the listener's own.
        let own = if id == 1 { listener.take() } else { None };
        threads.push(std::thread::spawn(move || {
            let listeners: Vec<Box<dyn EventListener>> = own
                .into_iter()
                .map(|l| Box::new(l) as Box<dyn EventListener>)
                .collect();
            let engine = UringEngine::new(64).expect("io_uring");
            let factory: ConnectionFactory =
                Box::new(|_, _| Err(io::Error::other("no TCP listener here")));
            Reactor::new(
                id,
                h,
                rx,
                peers,
                control,
                Vec::new(),
                listeners,
                engine,
                factory,
            )
            .unwrap()
            .run();
        }));
    }
    let connect = || {
        let mut client = TcpStream::connect(address).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        exchange(&mut client, b"abc", b"abc");
        exchange(&mut client, b"FF", b"C0C0");
        client
    };
    let load = |h: &ReactorHandle| h.connections.load(Ordering::Relaxed);
    // Two connections on two idle reactors: one each (the first on the listener's
    // reactor's successor in the rotation, whichever it is, and the second on the other).
    let a = connect();
    let b = connect();
    assert_eq!((load(&h0), load(&h1)), (1, 1));
    let (first, second) = {
        let p = placements.lock().unwrap();
        assert_eq!(p.accepted.len(), 2);
        assert_eq!(p.acceptors.len(), 2, "one acceptor per serving reactor");
        (p.accepted[0], p.accepted[1])
    };
    assert_ne!(
        first.0, second.0,
        "both requests on one reactor: {first:?} {second:?}"
    );
    // By load, not turn: with the second connection's reactor emptied by its acceptor
    // (the hosts' sockets stay open), the third request goes there.
    let hang_up = |reactor: usize| {
        let p = placements.lock().unwrap();
        let (_, efd) = p.acceptors.iter().find(|(r, _)| *r == reactor).unwrap();
        efd.write(1).unwrap();
    };
    hang_up(second.0);
    let handles = [&h0, &h1];
    wait_for(
        "the acceptor's hang-up did not close the connection",
        || load(handles[second.0]) == 0,
    );
    assert_eq!(load(handles[first.0]), 1);
    let c = connect();
    assert_eq!(placements.lock().unwrap().accepted[2].0, second.0);
    assert_eq!((load(&h0), load(&h1)), (1, 1));
    drop((a, b, c));
    wait_for("connections not released", || {
        load(&h0) == 0 && load(&h1) == 0
    });
    control.stop.store(true, Ordering::Release);
    h0.wake();
    h1.wake();
    for t in threads {
        t.join().unwrap();
    }
}

/// One reactor with the event listeners `listeners` builds on its thread and no TCP
/// listener; stop it with `control.stop` and a wake-up.
fn event_reactor(
    listeners: impl FnOnce() -> Vec<Box<dyn EventListener>> + Send + 'static,
) -> (
    Arc<ReactorHandle>,
    Arc<Control>,
    std::thread::JoinHandle<()>,
) {
    let control = Arc::new(Control::default());
    let (h0, rx0) = handle().unwrap();
    let peers = vec![Arc::clone(&h0)];
    let thread = {
        let control = Arc::clone(&control);
        let h0 = Arc::clone(&h0);
        std::thread::spawn(move || {
            let engine = UringEngine::new(64).expect("io_uring");
            let factory: ConnectionFactory =
                Box::new(|_, _| Err(io::Error::other("no TCP listener here")));
            Reactor::new(
                0,
                h0,
                rx0,
                peers,
                control,
                Vec::new(),
                listeners(),
                engine,
                factory,
            )
            .unwrap()
            .run();
        })
    };
    (h0, control, thread)
}

/// A reload adds an event listener on the reactor thread and later removes it: the
/// removed one is dropped at once (it owns no connection, so nothing waits for it), no
/// longer accepts, and the connection it brought in is still served.
#[test]
fn event_listeners_are_added_and_removed_live() {
    let (h0, control, thread) = event_reactor(Vec::new);
    let (socket, address) = loopback_socket();
    let file = Arc::new(tempfile());
    let placements = Arc::new(std::sync::Mutex::new(Placements::default()));
    let listener = SelfAccepting::new(socket, &file, &placements);
    let dropped = Arc::clone(&listener.dropped);
    let (tx, rx) = std::sync::mpsc::channel();
    let build: EventListenerBuilder = Box::new(move || Ok(Some(Box::new(listener))));
    assert!(h0.change_event_listener(EventListenerChange::Add { build, reply: tx }));
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), Ok(true));
    let mut client = TcpStream::connect(address).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    exchange(&mut client, b"abc", b"abc");
    assert_eq!(placements.lock().unwrap().accepted.len(), 1);

    let (tx, rx) = std::sync::mpsc::channel();
    let remove = |port_id, reply| EventListenerChange::Remove {
        port_id,
        address,
        reply,
    };
    assert!(h0.change_event_listener(remove(8, tx.clone())));
    assert!(
        !rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        "no port 8"
    );
    assert!(!dropped.load(Ordering::Acquire), "dropped for another port");
    assert!(h0.change_event_listener(remove(9, tx.clone())));
    assert!(rx.recv_timeout(Duration::from_secs(5)).unwrap());
    // Released by the time the reactor answered, under a live connection.
    assert!(dropped.load(Ordering::Acquire), "removed listener kept");
    // Not listening: a new client is refused.
    assert!(TcpStream::connect(address).is_err(), "late client accepted");
    // The connection made before the removal is still served.
    exchange(&mut client, b"def", b"def");
    assert_eq!(h0.connections.load(Ordering::Relaxed), 1);
    // Removing it again finds nothing.
    assert!(h0.change_event_listener(remove(9, tx)));
    assert!(!rx.recv_timeout(Duration::from_secs(5)).unwrap());
    drop(client);
    wait_for("connection not released", || {
        h0.connections.load(Ordering::Relaxed) == 0
    });
    control.stop.store(true, Ordering::Release);
    h0.wake();
    thread.join().unwrap();
}

fn tempfile() -> std::fs::File {
    // Unique per call: the tests of this module run in parallel in one process.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("nvmfd-reactor-{}-{n}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    file
}
