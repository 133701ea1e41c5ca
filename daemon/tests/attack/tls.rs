//! Hostile hosts of a port with `tls = "required"` (NVMe/TCP 1.1 §3.6, TP 8011), record layer
//! in user space on this host (no kernel TLS here): whatever arrives instead of a proper
//! ClientHello fails the handshake, a record that is forged or cut short, or a flood of
//! KeyUpdates, closes that connection — and the canary keeps doing verified I/O over TLS on
//! the same port meanwhile.

use std::io::Write;
use std::net::{Shutdown, TcpStream};

use openssl::ssl::{Ssl, SslConnector, SslMethod, SslVerifyMode, SslVersion};
use transport::client::{Client, ClientError, TlsParams};

use crate::support::*;

pub const CASES: &[(&str, CaseFn)] = &[
    (
        "garbage instead of a ClientHello",
        garbage_instead_of_client_hello,
    ),
    ("ClientHello without a PSK", client_hello_without_psk),
    ("wrong PSK", wrong_psk),
    ("plaintext ICReq on a required port", plaintext_icreq),
    ("truncated record", truncated_record),
    ("forged record", forged_record),
    ("KeyUpdates answered, I/O goes on", key_updates_then_io),
    ("KeyUpdate flood", key_update_flood),
];

fn tls(d: &Daemon) -> &TlsPort {
    d.tls.as_ref().expect("a daemon with Options::tls")
}

/// An established TLS connection with an enabled admin queue of a new controller.
fn tls_admin(d: &Daemon) -> Result<Client, String> {
    let t = tls(d);
    let mut c =
        Client::connect_tls(t.addr, options(), &t.params).map_err(|e| format!("TLS: {e}"))?;
    c.fabrics_connect(0, 31, 0xffff, SUBNQN, HOSTNQN, HOSTID, 30_000)
        .map_err(|e| format!("admin Connect over TLS: {e}"))?;
    c.enable_controller(WAIT)
        .map_err(|e| format!("CC.EN: {e}"))?;
    Ok(c)
}

/// The controller closed the connection (end of stream or reset), rather than answering or
/// staying silent.
fn expect_closed(c: &mut Client) -> Result<(), String> {
    match c.recv_pdu() {
        Err(ClientError::Timeout) => Err("still open".into()),
        Err(_) => Ok(()),
        Ok(p) => Err(format!("got {:?}, expected a close", p.header.pdu_type())),
    }
}

fn garbage_instead_of_client_hello(d: &Daemon) -> Result<(), String> {
    // Random bytes, and a handshake record header whose body is not a ClientHello.
    let mut bodies = vec![b"GET / HTTP/1.1\r\nHost: nvmfd\r\n\r\n".to_vec()];
    let mut fake = vec![22, 3, 1, 0, 40];
    fake.extend_from_slice(&[0x5a; 40]);
    bodies.push(fake);
    for body in bodies {
        let mut s = TcpStream::connect(tls(d).addr).map_err(|e| e.to_string())?;
        s.write_all(&body).map_err(|e| e.to_string())?;
        wait_closed(&mut s, WAIT)?;
    }
    Ok(())
}

/// A certificate-based TLS 1.3 client: this target has no certificate, the handshake fails.
fn client_hello_without_psk(d: &Daemon) -> Result<(), String> {
    let s = TcpStream::connect(tls(d).addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
    b.set_verify(SslVerifyMode::NONE);
    let mut ssl = Ssl::new(&b.build().into_context()).unwrap();
    ssl.set_connect_state();
    match ssl.connect(s) {
        Ok(_) => Err("handshake without a PSK succeeded".into()),
        Err(_) => Ok(()),
    }
}

fn wrong_psk(d: &Daemon) -> Result<(), String> {
    // The right identity, another key behind it.
    let params = TlsParams {
        psk: vec![0x5a; 32].into(),
        ..tls(d).params.clone()
    };
    match Client::connect_tls(tls(d).addr, options(), &params) {
        Ok(_) => Err("a wrong PSK was accepted".into()),
        Err(ClientError::Tls(_)) => Ok(()),
        Err(e) => Err(format!("expected a failed handshake: {e}")),
    }
}

/// An ICReq in plaintext where the ClientHello belongs: no ICResp, the connection closes.
fn plaintext_icreq(d: &Daemon) -> Result<(), String> {
    match Client::connect(tls(d).addr, options()) {
        Ok(_) => Err("a plaintext ICReq was answered on a required port".into()),
        Err(ClientError::Closed) => Ok(()),
        Err(ClientError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(()),
        Err(e) => Err(format!("expected a close: {e}")),
    }
}

/// Half a record, then the end of the stream.
fn truncated_record(d: &Daemon) -> Result<(), String> {
    let mut c = tls_admin(d)?;
    let mut raw = c.writer().map_err(|e| e.to_string())?;
    raw.write_all(&[23, 3, 3, 0, 200, 1, 2, 3, 4])
        .map_err(|e| e.to_string())?;
    raw.shutdown(Shutdown::Write).map_err(|e| e.to_string())?;
    expect_closed(&mut c)
}

/// A record under no key the session knows.
fn forged_record(d: &Daemon) -> Result<(), String> {
    let mut c = tls_admin(d)?;
    let mut forged = vec![23, 3, 3, 0, 64];
    forged.extend_from_slice(&[0xa5; 64]);
    c.writer()
        .and_then(|mut raw| raw.write_all(&forged))
        .map_err(|e| e.to_string())?;
    expect_closed(&mut c)
}

/// KeyUpdates between commands, some asking for the controller's: answered, and the queue
/// keeps working under the new keys both ways.
fn key_updates_then_io(d: &Daemon) -> Result<(), String> {
    let mut c = tls_admin(d)?;
    for round in 0..8 {
        c.key_update(round % 2 == 1)
            .map_err(|e| format!("KeyUpdate {round}: {e}"))?;
        c.keep_alive()
            .map_err(|e| format!("Keep Alive after KeyUpdate {round}: {e}"))?;
    }
    Ok(())
}

/// KeyUpdates without end (each asking for one back): the connection is dropped after a
/// bounded number, alone.
fn key_update_flood(d: &Daemon) -> Result<(), String> {
    let mut c = tls_admin(d)?;
    let mut sent = 0;
    while sent < 10_000 {
        if c.key_update(true).is_err() {
            break;
        }
        sent += 1;
    }
    expect(sent > 64, || format!("only {sent} KeyUpdates went out"))?;
    expect_closed(&mut c)?;
    d.wait_log(&["TLS records in a row without data"], WAIT)
        .map(|_| ())
}
