use super::*;
use nvmfd_auth::psk::ConfiguredPsk;
use openssl::ssl::SslConnector;
use openssl::symm::{decrypt_aead, encrypt_aead, Cipher};
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::net::TcpListener;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-6400-4e32-8565-326500000001";
const SUB: &str = "nqn.2026-12.dev.nvmfd:tls";
const KEY: &str = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
/// A SHA-384 configured PSK (48 bytes 0x64..0x93).
const KEY384: &str =
    "NVMeTLSkey-1:02:ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoOEhYaHiImKi4yNjo+QkZKTvGwQfg==:";

struct OneKey(ConfiguredPsk);

impl PskStore for OneKey {
    fn tls_psk(&self, identity: &Identity) -> Option<Zeroizing<Vec<u8>>> {
        (identity.hostnqn == HOST && identity.subnqn == SUB)
            .then(|| self.0.tls_psk(identity, Derivation::Rfc8446))
            .flatten()
    }
}

fn server() -> TlsServer {
    server_with(KEY)
}

fn server_with(key: &str) -> TlsServer {
    TlsServer::new(Arc::new(OneKey(ConfiguredPsk::parse(key).unwrap()))).unwrap()
}

/// An OpenSSL TLS 1.3 client offering `identity` with `psk`, as tlshd does for the host.
fn client(
    stream: TcpStream,
    identity: String,
    psk: Vec<u8>,
) -> Result<openssl::ssl::SslStream<TcpStream>, String> {
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
    b.set_ciphersuites("TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256")
        .unwrap();
    b.set_psk_client_callback(move |_, _, id_buf, psk_buf| {
        id_buf[..identity.len()].copy_from_slice(identity.as_bytes());
        id_buf[identity.len()] = 0;
        psk_buf[..psk.len()].copy_from_slice(&psk);
        Ok(psk.len())
    });
    let mut ssl = Ssl::new(&b.build().into_context()).unwrap();
    ssl.set_connect_state();
    ssl.connect(stream).map_err(|e| e.to_string())
}

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    (l.accept().unwrap().0, c)
}

fn host_psk(identity: &Identity) -> Vec<u8> {
    ConfiguredPsk::parse(KEY)
        .unwrap()
        .tls_psk(identity, Derivation::Rfc8446)
        .unwrap()
        .to_vec()
}

fn aead_cipher(aead: Aead) -> Cipher {
    match aead {
        Aead::Aes128Gcm => Cipher::aes_128_gcm(),
        Aead::Aes256Gcm => Cipher::aes_256_gcm(),
        Aead::ChaCha20Poly1305 => Cipher::chacha20_poly1305(),
    }
}

/// TLS 1.3 record: header (RFC 8446 §5.2) + the AEAD of content || type with the nonce
/// iv XOR seq (§5.3). Seals `plain` as application data.
fn seal(keys: &RecordKeys, plain: &[u8]) -> Vec<u8> {
    let mut inner = plain.to_vec();
    inner.push(23);
    let len = (inner.len() + 16) as u16;
    let header = [23, 3, 3, (len >> 8) as u8, len as u8];
    let mut tag = [0u8; 16];
    let ct = encrypt_aead(
        aead_cipher(keys.aead),
        &keys.key,
        Some(&nonce(keys)),
        &header,
        &inner,
        &mut tag,
    )
    .unwrap();
    [header.as_slice(), &ct, &tag].concat()
}

fn nonce(keys: &RecordKeys) -> [u8; 12] {
    let mut nonce = keys.iv;
    for (n, s) in nonce[4..].iter_mut().zip(keys.seq.to_be_bytes()) {
        *n ^= s;
    }
    nonce
}

/// The keys handed to the kernel are the session's: the server opens the client's first
/// application record with the RX keys, and the client reads a record sealed with the TX
/// keys — both at sequence number 0, as kTLS will start.
#[test]
fn handshake_yields_the_record_keys_of_both_directions() {
    let (srv, cli) = pair();
    let id = Identity::v0(PskHash::Sha256, HOST, SUB);
    let psk = host_psk(&id);
    let t = std::thread::spawn(move || {
        let mut tls = client(cli, id.to_string(), psk).unwrap();
        tls.write_all(b"ICReq under TLS").unwrap();
        let mut buf = [0u8; 32];
        let n = tls.read(&mut buf).unwrap();
        buf[..n].to_vec()
    });
    let est = server().handshake(srv, Duration::from_secs(10)).unwrap();
    assert_eq!(est.cipher, "TLS_AES_128_GCM_SHA256");
    assert_eq!(est.identity, Identity::v0(PskHash::Sha256, HOST, SUB));
    assert_eq!((est.tx.key.len(), est.rx.key.len()), (16, 16));
    let sent = exchange_first_records(&est);
    assert_eq!(t.join().unwrap(), sent);
}

/// The server's side of the first application records: opens the client's with the RX
/// keys (expecting "ICReq under TLS"), sends "ICResp" sealed with the TX keys; returns
/// what the client is to read.
fn exchange_first_records(est: &Established) -> Vec<u8> {
    let mut stream = est.tls.get_ref().stream().unwrap().try_clone().unwrap();
    let mut header = [0u8; 5];
    stream.read_exact(&mut header).unwrap();
    assert_eq!(header[0], 23, "application data record");
    let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).unwrap();
    let (ct, tag) = body.split_at(len - 16);
    let plain = decrypt_aead(
        aead_cipher(est.rx.aead),
        &est.rx.key,
        Some(&nonce(&est.rx)),
        &header,
        ct,
        tag,
    )
    .unwrap();
    assert_eq!(plain, b"ICReq under TLS\x17");
    stream.write_all(&seal(&est.tx, b"ICResp")).unwrap();
    b"ICResp".to_vec()
}

/// The record keys of every suite (the kernel's record layer gets them; this host has
/// none to try them on): AES-128-GCM, AES-256-GCM and ChaCha20-Poly1305 (a SHA-384
/// identity bound to SHA-256 as tlshd 1.0 does), each opening the client's first record
/// and sealing one the client's OpenSSL reads.
#[test]
fn record_keys_of_every_suite_are_the_sessions() {
    for (key_text, binding, suite, aead) in [
        (
            KEY,
            HostBinding::Identity,
            "TLS_AES_128_GCM_SHA256",
            Aead::Aes128Gcm,
        ),
        (
            KEY384,
            HostBinding::Identity,
            "TLS_AES_256_GCM_SHA384",
            Aead::Aes256Gcm,
        ),
        (
            KEY384,
            HostBinding::Tlshd1,
            "TLS_CHACHA20_POLY1305_SHA256",
            Aead::ChaCha20Poly1305,
        ),
    ] {
        let key = ConfiguredPsk::parse(key_text).unwrap();
        let id = Identity::v0(key.hash(), HOST, SUB);
        let psk = key.tls_psk(&id, Derivation::Rfc8446).unwrap();
        let (srv, cli) = pair();
        let t = std::thread::spawn(move || {
            let est = client_handshake(cli, &id, &psk, binding, Duration::from_secs(10)).unwrap();
            let (cipher, tx, rx) = (est.cipher, est.tx.aead, est.rx.aead);
            let mut tls = est.into_blocking();
            tls.write_all(b"ICReq under TLS").unwrap();
            let mut buf = [0u8; 32];
            let n = tls.read(&mut buf).unwrap();
            (cipher, tx, rx, buf[..n].to_vec())
        });
        let est = server_with(key_text)
            .handshake(srv, Duration::from_secs(10))
            .unwrap();
        assert_eq!(est.cipher, suite);
        assert_eq!((est.tx.aead, est.rx.aead), (aead, aead), "{suite}");
        assert_eq!(est.tx.key.len(), aead.key_len(), "{suite}");
        let sent = exchange_first_records(&est);
        assert_eq!(t.join().unwrap(), (suite, aead, aead, sent), "{suite}");
    }
}

#[test]
fn version_1_identity_is_accepted() {
    let (srv, cli) = pair();
    let key = ConfiguredPsk::parse(KEY).unwrap();
    let id = Identity::v1(&key, HOST, SUB, Derivation::Rfc8446);
    let psk = host_psk(&id);
    let name = id.to_string();
    let t = std::thread::spawn(move || client(cli, name, psk).map(|_| ()));
    // What an "optional" port looks at first: the ClientHello's record type, left unread.
    assert!(starts_with_tls(&srv, Duration::from_secs(10)).unwrap());
    let est = server().handshake(srv, Duration::from_secs(10)).unwrap();
    assert_eq!(est.identity, id);
    t.join().unwrap().unwrap();
}

#[test]
fn wrong_psk_or_unknown_identity_fails_the_handshake() {
    let id = Identity::v0(PskHash::Sha256, HOST, SUB);
    let cases = [
        (id.to_string(), vec![0x5a; 32], "wrong key"),
        (
            Identity::v0(PskHash::Sha256, HOST, "nqn.2026-12.dev.nvmfd:other").to_string(),
            host_psk(&id),
            "unknown subsystem",
        ),
        (
            "not an identity".to_string(),
            host_psk(&id),
            "garbage identity",
        ),
    ];
    for (identity, psk, what) in cases {
        let (srv, cli) = pair();
        let t = std::thread::spawn(move || client(cli, identity, psk).map(|_| ()));
        let result = server().handshake(srv, Duration::from_secs(10));
        assert!(result.is_err(), "{what}: handshake must fail");
        assert!(
            t.join().unwrap().is_err(),
            "{what}: the client must see the failure"
        );
    }
}

/// A ClientHello without a pre_shared_key extension (a certificate-based client): this
/// target has no certificate, so the handshake fails and the client is told.
#[test]
fn client_hello_without_psk_fails() {
    let (srv, cli) = pair();
    let t = std::thread::spawn(move || {
        let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
        b.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
        b.set_verify(openssl::ssl::SslVerifyMode::NONE);
        let mut ssl = Ssl::new(&b.build().into_context()).unwrap();
        ssl.set_connect_state();
        ssl.connect(cli).map(|_| ()).map_err(|e| e.to_string())
    });
    assert!(server().handshake(srv, Duration::from_secs(10)).is_err());
    assert!(t.join().unwrap().is_err());
}

#[test]
fn garbage_or_silence_instead_of_a_client_hello() {
    // A plaintext ICReq (PDU type 00h, HLEN 128) where the ClientHello belongs.
    let (srv, mut cli) = pair();
    let mut icreq = vec![0u8; 128];
    icreq[2] = 128;
    icreq[4] = 128;
    cli.write_all(&icreq).unwrap();
    assert!(!starts_with_tls(&srv, Duration::from_secs(5)).unwrap());
    assert!(server().handshake(srv, Duration::from_secs(5)).is_err());
    // A host that says nothing is dropped at the deadline.
    let (srv, _cli) = pair();
    let started = Instant::now();
    let err = server()
        .handshake(srv, Duration::from_millis(300))
        .err()
        .expect("no ClientHello: the handshake must fail");
    assert!(started.elapsed() < Duration::from_secs(5), "{err}");
}

#[test]
fn record_keys_follow_rfc8446_key_schedule() {
    // RFC 8448 §3 (simple 1-RTT handshake), server application traffic secret and the
    // server write key / iv derived from it.
    let secret = unhex("a11af9f05531f856ad47116b45a950328204b4f44bfb6b3a4b4f1f3fcb631643").unwrap();
    let keys = Suite::named("TLS_AES_128_GCM_SHA256")
        .unwrap()
        .record_keys(&secret, 0);
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    assert_eq!(hex(&keys.key), "9f02283b6c9c07efc26bb9f2ac92e356");
    assert_eq!(hex(&keys.iv), "cf782b88dd83549aadf1e984");
}

/// Both ends of one session with their record layers in user space (non-blocking).
fn user_space_pair() -> ((TcpStream, RecordLayer), (TcpStream, RecordLayer)) {
    user_space_pair_with(KEY, "TLS_AES_128_GCM_SHA256")
}

fn user_space_pair_with(
    key_text: &str,
    cipher: &str,
) -> ((TcpStream, RecordLayer), (TcpStream, RecordLayer)) {
    user_space_pair_as(key_text, true, HostBinding::Identity, cipher)
}

/// [`user_space_pair_with`] with a version 0 or 1 identity, the client binding its PSK as
/// `binding` says.
fn user_space_pair_as(
    key_text: &str,
    version_1: bool,
    binding: HostBinding,
    cipher: &str,
) -> ((TcpStream, RecordLayer), (TcpStream, RecordLayer)) {
    let (srv, cli) = pair();
    let key = ConfiguredPsk::parse(key_text).unwrap();
    let id = if version_1 {
        Identity::v1(&key, HOST, SUB, Derivation::Rfc8446)
    } else {
        Identity::v0(key.hash(), HOST, SUB)
    };
    let psk = key.tls_psk(&id, Derivation::Rfc8446).unwrap().to_vec();
    let t = std::thread::spawn(move || {
        client_handshake(cli, &id, &psk, binding, Duration::from_secs(10))
            .unwrap()
            .secure(false)
            .unwrap()
    });
    let server = server_with(key_text)
        .handshake(srv, Duration::from_secs(10))
        .unwrap()
        .secure(false)
        .unwrap();
    let client = t.join().unwrap();
    assert_eq!(server.kind(), RecordLayerKind::User);
    assert_eq!((server.cipher, client.cipher), (cipher, cipher));
    assert_eq!(server.identity, client.identity);
    assert_eq!(server.psk_hash, client.psk_hash);
    let open = |s: Secured| (s.stream, *s.record.unwrap());
    (open(server), open(client))
}

fn send_all(end: &mut (TcpStream, RecordLayer), mut data: &[u8]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !data.is_empty() || end.1.has_output() {
        assert!(Instant::now() < deadline, "send stalled");
        match end.1.write_vectored(&mut &end.0, &[IoSlice::new(data)]) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("send: {e}"),
        }
    }
}

fn receive(end: &mut (TcpStream, RecordLayer), len: usize) -> io::Result<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = vec![0u8; len];
    let mut have = 0;
    while have < len {
        assert!(Instant::now() < deadline, "receive stalled");
        match end.1.read(&mut &end.0, &mut out[have..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => have += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Answers (KeyUpdates) go out while waiting, as the reactor flushes.
                let _ = end.1.flush(&mut &end.0);
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// Data both ways through the user-space record layers, large writes and small ones, and
/// KeyUpdates (one requesting ours in return) between them: the data arrives intact under
/// the new keys on both sides.
#[test]
fn user_space_record_layer_moves_data_across_key_updates() {
    let (mut server, mut client) = user_space_pair();
    let big = pattern(300_000, 7);
    send_all(&mut client, &big);
    assert_eq!(receive(&mut server, big.len()).unwrap(), big);
    for request in [false, true, true] {
        client.1.key_update(request).unwrap();
        send_all(&mut client, b"after a KeyUpdate");
        assert_eq!(receive(&mut server, 17).unwrap(), b"after a KeyUpdate");
        let echo = pattern(70_000, 9);
        send_all(&mut server, &echo);
        assert_eq!(receive(&mut client, echo.len()).unwrap(), echo);
    }
    // Many small writes in one gather: one record, the bytes in order.
    let pieces = [&b"abc"[..], b"", b"defgh", &[0u8; 100]];
    let iov: Vec<IoSlice<'_>> = pieces.iter().map(|p| IoSlice::new(p)).collect();
    assert_eq!(server.1.write_vectored(&mut &server.0, &iov).unwrap(), 108);
    send_all(&mut server, &[]);
    assert_eq!(receive(&mut client, 108).unwrap(), pieces.concat());
    // close_notify is not required: end of stream at a record boundary is a clean close.
    drop(client);
    let mut buf = [0u8; 16];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match server.1.read(&mut &server.0, &mut buf) {
            Ok(0) => break,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline);
                std::thread::sleep(Duration::from_millis(1));
            }
            other => panic!("expected end of stream, got {other:?}"),
        }
    }
}

/// KeyUpdates without data in between beyond the limit: the connection fails (and only
/// the reading of it), whatever the peer asks for.
#[test]
fn key_update_flood_is_cut_off() {
    let (mut server, mut client) = user_space_pair();
    for i in 0..=super::super::record::MAX_RECORDS_WITHOUT_DATA {
        client.1.key_update(i % 2 == 0).unwrap();
    }
    send_all(&mut client, b"late");
    let err = receive(&mut server, 4).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains("without data"), "{err}");
}

/// A record that does not authenticate, and one cut short by the end of the stream: each
/// is an error for that connection.
#[test]
fn forged_or_truncated_records_fail() {
    let (mut server, client) = user_space_pair();
    let mut forged = vec![23, 3, 3, 0, 40];
    forged.extend_from_slice(&[0x41; 40]);
    (&client.0).write_all(&forged).unwrap();
    let err = receive(&mut server, 1).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");

    let (mut server, client) = user_space_pair();
    (&client.0).write_all(&[23, 3, 3, 0, 200, 1, 2, 3]).unwrap();
    client.0.shutdown(std::net::Shutdown::Write).unwrap();
    let err = receive(&mut server, 1).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
}

/// A socket in memory as edge-triggered readiness leaves it: what arrived since the last
/// event is there at the next read, then the reads fail with WouldBlock (the socket has
/// nothing more and no new event will come). It takes at most `room` bytes of writes.
struct MemSocket {
    input: Vec<u8>,
    reads: usize,
    written: Vec<u8>,
    room: usize,
}

impl MemSocket {
    fn new(input: Vec<u8>, room: usize) -> Self {
        MemSocket {
            input,
            reads: 0,
            written: Vec::new(),
            room,
        }
    }
}

impl Read for MemSocket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.reads += 1;
        if self.input.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(self.input.len());
        buf[..n].copy_from_slice(&self.input[..n]);
        self.input.drain(..n);
        Ok(n)
    }
}

impl Write for MemSocket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(self.room - self.written.len());
        if n == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.written.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The records of one burst as the host's record layer seals them: data of 1 byte to
/// several full records, an empty write (no record) and a KeyUpdate between them, more
/// ciphertext in all than one receive buffer holds. Returns the ciphertext and the
/// plaintext it carries.
fn burst(client: &mut RecordLayer) -> (Vec<u8>, Vec<u8>) {
    let chunks = [
        pattern(10, 1),
        pattern(4168, 2),
        Vec::new(),
        pattern(16384, 3),
        pattern(1, 4),
        pattern(30_000, 5),
        pattern(72, 6),
        pattern(70_000, 7),
    ];
    let mut wire = MemSocket::new(Vec::new(), usize::MAX);
    for (i, chunk) in chunks.iter().enumerate() {
        if i == 2 {
            client.key_update(false).unwrap();
        }
        let mut rest = &chunk[..];
        loop {
            let n = client
                .write_vectored(&mut wire, &[IoSlice::new(rest)])
                .unwrap();
            rest = &rest[n..];
            if rest.is_empty() {
                break;
            }
        }
        assert!(!client.has_output());
    }
    (wire.written, chunks.concat())
}

/// A burst of records arrives at once, as one readiness event: a consumer taking a few
/// bytes at a time gets every byte before the record layer first says WouldBlock. The
/// reactor reads until WouldBlock and is not woken again for bytes the socket already
/// delivered (edge-triggered), so plaintext left in OpenSSL (`SSL_pending`) or ciphertext
/// left in the receive buffer at that point would wait for the next packet from the peer.
#[test]
fn records_of_one_readiness_event_are_all_delivered_before_would_block() {
    for take in [1usize, 7, 100, 4096, 65536] {
        let (mut server, mut client) = user_space_pair();
        let (ciphertext, expected) = burst(&mut client.1);
        assert!(ciphertext.len() > super::super::record::RECEIVE_BUFFER);
        let mut sock = MemSocket::new(ciphertext, usize::MAX);
        let mut got = Vec::new();
        let mut buf = vec![0u8; take];
        let end = loop {
            match server.1.read(&mut sock, &mut buf) {
                Ok(0) => break "end of stream",
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break "WouldBlock",
                Err(e) => panic!("read with {take}-byte buffers: {e}"),
            }
        };
        assert_eq!(end, "WouldBlock");
        assert_eq!(got.len(), expected.len(), "{take}-byte buffers");
        assert!(got == expected, "{take}-byte buffers: data differs");
    }
}

/// One socket read feeds several records: a burst of three records that one read brings
/// is opened by one read call, gathered in order across the caller's buffers (a command's
/// data, then the staging buffer); the next call reads the socket, which is drained.
/// Buffers smaller than the burst take it in turn, still from that one socket read.
#[test]
fn one_socket_read_feeds_several_records() {
    let (mut server, mut client) = user_space_pair();
    let parts = [pattern(1000, 1), pattern(3000, 2), pattern(500, 3)];
    let mut wire = MemSocket::new(Vec::new(), usize::MAX);
    for part in &parts {
        // One write call, one record.
        let taken = client.1.write_vectored(&mut wire, &[IoSlice::new(part)]);
        assert_eq!(taken.unwrap(), part.len());
    }
    let expected = parts.concat();

    let mut sock = MemSocket::new(wire.written.clone(), usize::MAX);
    let (mut data, mut staging) = (vec![0u8; 1500], vec![0u8; 32 * 1024]);
    let mut iov = [IoSliceMut::new(&mut data), IoSliceMut::new(&mut staging)];
    assert_eq!(server.1.read_vectored(&mut sock, &mut iov).unwrap(), 4500);
    assert_eq!(sock.reads, 1);
    assert!(data[..] == expected[..1500] && staging[..3000] == expected[1500..]);
    let err = server.1.read(&mut sock, &mut staging).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    assert_eq!(sock.reads, 2);

    let (mut server, mut client) = user_space_pair();
    let mut wire = MemSocket::new(Vec::new(), usize::MAX);
    for part in &parts {
        client
            .1
            .write_vectored(&mut wire, &[IoSlice::new(part)])
            .unwrap();
    }
    let mut sock = MemSocket::new(wire.written, usize::MAX);
    let mut got = Vec::new();
    let mut buf = [0u8; 2000];
    for want in [2000, 2000, 500] {
        let n = server.1.read(&mut sock, &mut buf).unwrap();
        assert_eq!(n, want);
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(sock.reads, 1);
    assert!(got == expected);
}

/// A record that fails after data of the same socket read: the data comes first, the
/// error with the next call (and the connection closes then).
#[test]
fn an_error_after_data_of_the_same_read_comes_with_the_next_call() {
    let (mut server, mut client) = user_space_pair();
    let mut wire = MemSocket::new(Vec::new(), usize::MAX);
    client
        .1
        .write_vectored(&mut wire, &[IoSlice::new(b"ICReq")])
        .unwrap();
    let mut input = wire.written;
    input.extend_from_slice(&[23, 3, 3, 0, 40]);
    input.extend_from_slice(&[0x41; 40]);
    let mut sock = MemSocket::new(input, usize::MAX);
    let mut buf = [0u8; 4096];
    assert_eq!(server.1.read(&mut sock, &mut buf).unwrap(), 5);
    assert_eq!(&buf[..5], b"ICReq");
    let err = server.1.read(&mut sock, &mut buf).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    assert_eq!(sock.reads, 1);
}

/// Sending into a socket that takes only part of the sealed records: all the plaintext
/// is taken, the rest of the ciphertext waits in the record layer and says so
/// (`has_output`, which arms EPOLLOUT), and flushing when the socket has room delivers
/// every byte.
#[test]
fn sealed_records_the_socket_did_not_take_are_reported_and_sent_later() {
    let (mut server, mut client) = user_space_pair();
    let data = pattern(40_000, 8);
    let mut sock = MemSocket::new(Vec::new(), 1000);
    assert_eq!(
        client
            .1
            .write_vectored(&mut sock, &[IoSlice::new(&data)])
            .unwrap(),
        data.len()
    );
    assert!(client.1.has_output());
    let err = client.1.flush(&mut sock).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    sock.room = usize::MAX;
    client.1.flush(&mut sock).unwrap();
    assert!(!client.1.has_output());
    let mut rx = MemSocket::new(sock.written, usize::MAX);
    let mut got = vec![0u8; data.len()];
    let mut have = 0;
    while have < data.len() {
        have += server.1.read(&mut rx, &mut got[have..]).unwrap();
    }
    assert!(got == data);
}

/// A SHA-384 PSK (`NVMe1R02`): TLS_AES_256_GCM_SHA384 with 256-bit record keys, data both
/// ways; the same key offered under a SHA-256 identity finds nothing.
#[test]
fn sha384_psk_negotiates_aes_256_gcm_sha384() {
    let (mut server, mut client) = user_space_pair_with(KEY384, "TLS_AES_256_GCM_SHA384");
    let data = pattern(50_000, 3);
    send_all(&mut client, &data);
    assert_eq!(receive(&mut server, data.len()).unwrap(), data);
    send_all(&mut server, b"ICResp");
    assert_eq!(receive(&mut client, 6).unwrap(), b"ICResp");

    let (srv, cli) = pair();
    let t = std::thread::spawn(move || {
        let id = Identity::v0(PskHash::Sha384, HOST, SUB);
        let key = ConfiguredPsk::parse(KEY384).unwrap();
        let psk = key.tls_psk(&id, Derivation::Rfc8446).unwrap();
        let est = client_handshake(
            cli,
            &id,
            &psk,
            HostBinding::Identity,
            Duration::from_secs(10),
        )
        .unwrap();
        (est.cipher, est.tx.key.len())
    });
    let est = server_with(KEY384)
        .handshake(srv, Duration::from_secs(10))
        .unwrap();
    assert_eq!(est.cipher, "TLS_AES_256_GCM_SHA384");
    assert_eq!((est.tx.key.len(), est.rx.key.len()), (32, 32));
    assert_eq!(t.join().unwrap(), ("TLS_AES_256_GCM_SHA384", 32));

    // A SHA-256 identity for a SHA-384 key: no PSK, no handshake.
    let (srv, cli) = pair();
    let t = std::thread::spawn(move || {
        let id = Identity::v0(PskHash::Sha256, HOST, SUB);
        let binding = HostBinding::Identity;
        client_handshake(cli, &id, &[7u8; 32], binding, Duration::from_secs(10)).map(|_| ())
    });
    assert!(server_with(KEY384)
        .handshake(srv, Duration::from_secs(10))
        .is_err());
    assert!(t.join().unwrap().is_err());
}
/// A PSK is bound to its hash (RFC 8446 §4.2.11): whatever order the host offers both
/// suites in, a SHA-384 PSK gets TLS_AES_256_GCM_SHA384 and a SHA-256 PSK
/// TLS_AES_128_GCM_SHA256, under either identity version.
#[test]
fn psk_hash_decides_the_suite_whatever_the_client_order() {
    let both_128_first = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384";
    let both_256_first = "TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256";
    let cases = [
        (KEY384, both_128_first, "TLS_AES_256_GCM_SHA384", 32),
        (KEY384, both_256_first, "TLS_AES_256_GCM_SHA384", 32),
        (KEY, both_256_first, "TLS_AES_128_GCM_SHA256", 16),
        (KEY, both_128_first, "TLS_AES_128_GCM_SHA256", 16),
    ];
    for (key_text, offered, expected, key_len) in cases {
        let key = ConfiguredPsk::parse(key_text).unwrap();
        for id in [
            Identity::v0(key.hash(), HOST, SUB),
            Identity::v1(&key, HOST, SUB, Derivation::Rfc8446),
        ] {
            let psk = key.tls_psk(&id, Derivation::Rfc8446).unwrap();
            let (srv, cli) = pair();
            let t = std::thread::spawn(move || {
                let bind = id.hash;
                client_handshake_offering(cli, &id, &psk, bind, offered, Duration::from_secs(10))
                    .map(|est| est.cipher)
                    .map_err(|e| e.to_string())
            });
            let est = server_with(key_text).handshake(srv, Duration::from_secs(10));
            let client = t.join().unwrap();
            let what = format!("{key_text} offered {offered}");
            let est = est.unwrap_or_else(|e| panic!("{what}: server: {e}; client: {client:?}"));
            assert_eq!(est.cipher, expected, "{what}");
            assert_eq!((est.tx.key.len(), est.rx.key.len()), (key_len, key_len));
            assert_eq!(client.as_deref(), Ok(expected), "{what}");
        }
    }
    // A SHA-384 PSK from a host that offers only the SHA-256 suite: no suite fits it.
    let key = ConfiguredPsk::parse(KEY384).unwrap();
    let id = Identity::v0(PskHash::Sha384, HOST, SUB);
    let psk = key.tls_psk(&id, Derivation::Rfc8446).unwrap();
    let (srv, cli) = pair();
    let t = std::thread::spawn(move || {
        let suite = "TLS_AES_128_GCM_SHA256";
        let bind = PskHash::Sha384;
        client_handshake_offering(cli, &id, &psk, bind, suite, Duration::from_secs(10)).map(|_| ())
    });
    assert!(server_with(KEY384)
        .handshake(srv, Duration::from_secs(10))
        .is_err());
    assert!(t.join().unwrap().is_err());
}

#[test]
fn offered_psks_are_read_with_every_length_checked() {
    // Two identities ("ab", "c"), each with its ticket age, then binders of 2 and 1 bytes.
    let ids = [0, 15, 0, 2, b'a', b'b', 0, 0, 0, 0, 0, 1, b'c', 0, 0, 0, 0];
    let ext = [&ids[..], &[0, 5, 2, 9, 9, 1, 9]].concat();
    assert_eq!(
        offered_psks(&ext),
        Some(vec![(&b"ab"[..], 2), (&b"c"[..], 1)])
    );
    let cut = |n: usize| ext[..ext.len() - n].to_vec();
    for bad in [
        vec![],
        vec![0],
        vec![0, 0, 0, 0],                                           // no identity
        [&[0, 16][..], &ids[2..], &[0, 5, 2, 9, 9, 1, 9]].concat(), // list beyond its end
        vec![0, 6, 0, 2, b'a', b'b', 0, 0, 0, 2, 1, 9],             // ticket age cut off
        vec![0, 5, 0, 0, 0, 0, 0, 0, 2, 1, 9],                      // empty identity
        vec![0, 7, 0, 9, b'a', b'b', 0, 0, 0, 0, 2, 1, 9],          // identity beyond the list
        ids.to_vec(),                                               // no binders
        cut(1),                                                     // binder list beyond the body
        [&ids[..], &[0, 3, 2, 9, 9]].concat(),                      // one binder for two identities
        [&ids[..], &[0, 6, 2, 9, 9, 1, 9, 0]].concat(),             // a third binder
    ] {
        assert_eq!(offered_psks(&bad), None, "{bad:?}");
    }
}

/// The PSK (`NVMe0R02` / `NVMe1R02`, 48 bytes) of a SHA-384 identity bound to SHA-256 by
/// the host (a 32-byte binder), as tlshd 1.0 does offering TLS_AES_256_GCM_SHA384 and
/// TLS_CHACHA20_POLY1305_SHA256, or as OpenSSL's legacy PSK callback does offering both
/// AES-GCM suites: run as a SHA-256 PSK under the SHA-256 suite the host offers, both
/// sides agreeing. The same host with a wrong key, an unknown identity, or no SHA-256
/// suite on offer still fails.
#[test]
fn sha384_identity_bound_to_sha256_runs_as_a_sha256_psk() {
    let key = ConfiguredPsk::parse(KEY384).unwrap();
    for id in [
        Identity::v0(PskHash::Sha384, HOST, SUB),
        Identity::v1(&key, HOST, SUB, Derivation::Rfc8446),
    ] {
        let psk = key.tls_psk(&id, Derivation::Rfc8446).unwrap();
        assert_eq!(psk.len(), 48);
        let (srv, cli) = pair();
        let (client_id, client_psk) = (id.clone(), psk.clone());
        let t = std::thread::spawn(move || {
            let binding = HostBinding::Tlshd1;
            client_handshake(
                cli,
                &client_id,
                &client_psk,
                binding,
                Duration::from_secs(10),
            )
            .map(|est| (est.cipher, est.psk_hash))
            .map_err(|e| e.to_string())
        });
        let est = server_with(KEY384)
            .handshake(srv, Duration::from_secs(10))
            .unwrap();
        assert_eq!(est.identity, id);
        assert_eq!(
            (est.cipher, est.psk_hash),
            ("TLS_CHACHA20_POLY1305_SHA256", PskHash::Sha256)
        );
        assert_eq!(
            t.join().unwrap(),
            Ok(("TLS_CHACHA20_POLY1305_SHA256", PskHash::Sha256))
        );

        let (srv, cli) = pair();
        let (name, legacy_psk) = (id.to_string(), psk.to_vec());
        let t = std::thread::spawn(move || client(cli, name, legacy_psk).map(|_| ()));
        let est = server_with(KEY384)
            .handshake(srv, Duration::from_secs(10))
            .unwrap();
        assert_eq!(
            (est.cipher, est.psk_hash),
            ("TLS_AES_128_GCM_SHA256", PskHash::Sha256)
        );
        t.join().unwrap().unwrap();
    }

    let id = Identity::v0(PskHash::Sha384, HOST, SUB);
    let psk = key.tls_psk(&id, Derivation::Rfc8446).unwrap();
    let stranger = Identity::v0(PskHash::Sha384, HOST, "nqn.2026-12.dev.nvmfd:other");
    let only_aes256 = "TLS_AES_256_GCM_SHA384";
    let cases = [
        (
            id.clone(),
            vec![0x5a; 48],
            REBOUND_SUITES,
            "tried as a SHA-256 PSK",
        ),
        (
            stranger,
            psk.to_vec(),
            REBOUND_SUITES,
            "no PSK for identity",
        ),
        (id, psk.to_vec(), only_aes256, "tried as a SHA-256 PSK"),
    ];
    for (id, psk, suites, reason) in cases {
        let (srv, cli) = pair();
        let what = format!("{id} offering {suites}");
        let t = std::thread::spawn(move || {
            let (bind, timeout) = (PskHash::Sha256, Duration::from_secs(10));
            client_handshake_offering(cli, &id, &psk, bind, suites, timeout).map(|_| ())
        });
        let err = server_with(KEY384)
            .handshake(srv, Duration::from_secs(10))
            .err()
            .unwrap_or_else(|| panic!("{what}: the handshake must fail"));
        assert!(err.to_string().contains(reason), "{what}: {err}");
        assert!(t.join().unwrap().is_err(), "{what}: the client must see it");
    }
}

/// A SHA-256 identity whose PSK the host bound to SHA-384 (a 48-byte binder): no suite
/// verifies it, and the refusal says why.
#[test]
fn sha256_identity_bound_to_sha384_is_refused_with_the_reason() {
    let id = Identity::v0(PskHash::Sha256, HOST, SUB);
    let psk = host_psk(&id);
    let (srv, cli) = pair();
    let t = std::thread::spawn(move || {
        let suites = "TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256";
        let (bind, timeout) = (PskHash::Sha384, Duration::from_secs(10));
        client_handshake_offering(cli, &id, &psk, bind, suites, timeout).map(|_| ())
    });
    let err = server()
        .handshake(srv, Duration::from_secs(10))
        .err()
        .expect("a misbound PSK must fail the handshake");
    assert!(t.join().unwrap().is_err());
    match err {
        TlsError::PskBinding(why, _) => {
            assert!(why.contains("Sha384 (a 48-byte binder)"), "{why}")
        }
        other => panic!("{other}"),
    }
}

/// Sealed by `sender` into memory: `first`, a KeyUpdate, `second` (three records).
fn sealed(sender: &mut RecordLayer, first: &[u8], second: &[u8]) -> Vec<u8> {
    let mut wire = MemSocket::new(Vec::new(), usize::MAX);
    let taken = sender.write_vectored(&mut wire, &[IoSlice::new(first)]);
    assert_eq!(taken.unwrap(), first.len());
    sender.key_update(false).unwrap();
    let taken = sender.write_vectored(&mut wire, &[IoSlice::new(second)]);
    assert_eq!(taken.unwrap(), second.len());
    assert!(!sender.has_output());
    wire.written
}

/// Reads from `sock` until the record layer says WouldBlock.
fn drain(receiver: &mut RecordLayer, sock: &mut MemSocket, got: &mut Vec<u8>) {
    let mut buf = [0u8; 512];
    loop {
        match receiver.read(sock, &mut buf) {
            Ok(0) => panic!("end of stream"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// Every suite × identity version (ChaCha20-Poly1305: a SHA-384 identity bound to SHA-256
/// as tlshd 1.0 does), user-space record layers at both ends: data both ways over the
/// socket, then records (data, KeyUpdate, data) in each direction arriving in two pieces
/// cut at every byte — each cut a new set of records of the same session — the plaintext
/// intact every time.
#[test]
fn every_suite_moves_data_both_ways_split_at_every_byte() {
    let cases = [
        (KEY, HostBinding::Identity, "TLS_AES_128_GCM_SHA256"),
        (KEY384, HostBinding::Identity, "TLS_AES_256_GCM_SHA384"),
        (KEY384, HostBinding::Tlshd1, "TLS_CHACHA20_POLY1305_SHA256"),
    ];
    for (key_text, binding, suite) in cases {
        for version_1 in [false, true] {
            let what = format!("{suite}, identity version {}", u8::from(version_1));
            let (mut server, mut client) = user_space_pair_as(key_text, version_1, binding, suite);
            let data = pattern(50_000, 4);
            send_all(&mut client, &data);
            assert!(receive(&mut server, data.len()).unwrap() == data, "{what}");
            send_all(&mut server, &data[..20_000]);
            assert!(
                receive(&mut client, 20_000).unwrap() == data[..20_000],
                "{what}"
            );

            let (first, second) = (pattern(5, 1), pattern(300, 2));
            let expected = [&first[..], &second[..]].concat();
            for client_sends in [true, false] {
                let (sender, receiver) = if client_sends {
                    (&mut client.1, &mut server.1)
                } else {
                    (&mut server.1, &mut client.1)
                };
                // The first set read whole, then one set per cut.
                let wire = sealed(sender, &first, &second);
                let len = wire.len();
                let mut sock = MemSocket::new(wire, usize::MAX);
                let mut got = Vec::new();
                drain(receiver, &mut sock, &mut got);
                assert!(got == expected, "{what}: whole");
                for cut in 1..len {
                    let wire = sealed(sender, &first, &second);
                    assert_eq!(wire.len(), len);
                    let mut sock = MemSocket::new(wire[..cut].to_vec(), usize::MAX);
                    let mut got = Vec::new();
                    drain(receiver, &mut sock, &mut got);
                    sock.input.extend_from_slice(&wire[cut..]);
                    drain(receiver, &mut sock, &mut got);
                    assert!(got == expected, "{what}: split at byte {cut}");
                }
            }
        }
    }
}
