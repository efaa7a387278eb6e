//! A server-side TLS stream that holds no buffer while idle ([`LeanTls`]), on rustls'
//! unbuffered API.
//!
//! tokio-rustls drives rustls' buffered connection, which keeps a 4 KiB record buffer for
//! the connection's life once a record was read (rustls allocates it before every read and
//! has no way to give it back): 4 of an idle session's 16 KiB at the hub. Here the records
//! received, the plaintext not yet read and the records not yet sent each live in a `Vec`
//! of their own that is given back (`Vec::new()`) as soon as it is empty, and the socket is
//! read through a buffer on the stack. An idle session holds rustls' connection state and
//! keys, no buffer. See docs/decisions/0041-lean-tls.md.
//!
//! The handshake runs on the same connection (a buffered rustls connection cannot become an
//! unbuffered one), with the same [`ServerConfig`]: client-certificate verification, the
//! certificate resolver, ALPN. Bounds as rustls' buffered connection: a record over 16 KiB
//! plus overhead is refused by rustls' deframer; what waits for the rest of a record or a
//! handshake message is at most [`MAX_INCOMING`] bytes; what is encrypted ahead of the
//! socket is one write's worth ([`MAX_WRITE`] of plaintext), taken only once what was before
//! it is sent.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use rustls::ServerConfig;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, EncodeTlsData, EncryptError, UnbufferedStatus};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most bytes of unfinished records kept: a handshake message being joined from its
/// records (rustls' buffered connection allows 64 KiB for one) and one record more. A peer
/// that needs more to make progress is refused.
pub(crate) const MAX_INCOMING: usize = 0xffff + 16_384 + 2_048 + 5;

/// What one read from the socket takes at most (on the stack, copied to the heap only for
/// as long as a record is unfinished): a whole record of the usual size and its overhead.
const READ_CHUNK: usize = 16_384 + 512;

/// The most plaintext one `poll_write` encrypts (four full records): what is encrypted
/// ahead of the socket, as rustls' buffered connection's default send limit (64 KiB).
pub(crate) const MAX_WRITE: usize = 4 * 16_384;

/// A server-side TLS connection over `IO` (see the module's documentation).
pub(crate) struct LeanTls<IO> {
    io: IO,
    conn: UnbufferedServerConnection,
    /// TLS bytes received and not yet processed: an unfinished record (or handshake
    /// message). Empty (no allocation) between records.
    incoming: Vec<u8>,
    /// Plaintext decrypted and not yet read, from `plaintext_at`. Empty (no allocation)
    /// once read.
    plaintext: Vec<u8>,
    plaintext_at: usize,
    /// TLS records to send, from `outgoing_at`. Empty (no allocation) once sent.
    outgoing: Vec<u8>,
    outgoing_at: usize,
    /// The peer sent close_notify: no more application data comes.
    peer_closed: bool,
    /// The socket read its end (with or without close_notify).
    eof: bool,
    /// Our close_notify is queued: nothing more is written.
    closed_for_writing: bool,
    /// rustls failed (a bad record, a protocol violation): the connection is unusable.
    failed: bool,
}

/// Where processing what was received stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// rustls needs more bytes from the peer (during the handshake; after it, `Writable`
    /// says the same).
    NeedData,
    /// Application data may be written (and everything received so far is processed).
    Writable,
    /// Both ends sent close_notify.
    Closed,
}

/// What to do when rustls reaches its `WriteTraffic` state.
enum Write<'a> {
    Nothing,
    /// Encrypt this plaintext.
    Data(&'a [u8]),
    /// Queue close_notify.
    CloseNotify,
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl<IO: AsyncRead + AsyncWrite + Unpin> LeanTls<IO> {
    /// Runs the server's handshake on `io` with `config`. Not bounded in time here: the
    /// caller's deadline is (the accept path's handshake timeout); in bytes by
    /// [`MAX_INCOMING`]. A failure carries rustls' error (for `tls_hint`) and the alert
    /// rustls chose is sent first, as tokio-rustls does.
    pub(crate) async fn accept(io: IO, config: Arc<ServerConfig>) -> io::Result<Self> {
        let conn = UnbufferedServerConnection::new(config).map_err(tls_error)?;
        let mut tls = Self {
            io,
            conn,
            incoming: Vec::new(),
            plaintext: Vec::new(),
            plaintext_at: 0,
            outgoing: Vec::new(),
            outgoing_at: 0,
            peer_closed: false,
            eof: false,
            closed_for_writing: false,
            failed: false,
        };
        loop {
            let processed = tls.process(None, Write::Nothing);
            // Whatever rustls wrote goes out first: its alert after a failure, too.
            let flushed = std::future::poll_fn(|cx| tls.poll_send(cx)).await;
            let stop = processed?;
            flushed?;
            if !tls.conn.is_handshaking() {
                return Ok(tls);
            }
            if stop == Stop::Closed || tls.peer_closed {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed during the TLS handshake"));
            }
            if tls.eof {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "tls handshake eof"));
            }
            std::future::poll_fn(|cx| tls.poll_receive(cx)).await?;
        }
    }

    /// The peer's verified certificate chain (rustls' own copy).
    pub(crate) fn peer_certificates(&self) -> Option<&[rustls::pki_types::CertificateDer<'static>]> {
        self.conn.peer_certificates()
    }

    /// Whether the connection holds any buffer of its own (it should not while idle).
    #[cfg(test)]
    pub(crate) fn buffered_capacity(&self) -> usize {
        self.incoming.capacity() + self.plaintext.capacity() + self.outgoing.capacity()
    }

    /// Lets rustls process what was received until it needs more or can take application
    /// data, then does `write` if it can. Application data goes to `read` (as much as it
    /// takes), the rest to `plaintext`; records rustls writes (handshake, alerts, a key
    /// update's answer) go to `outgoing`. Returns where it stopped and how much of
    /// `Write::Data` was taken (all of it, or nothing when it could not be written).
    fn process(&mut self, mut read: Option<&mut ReadBuf<'_>>, write: Write<'_>) -> io::Result<Stop> {
        if self.failed {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the TLS connection failed before"));
        }
        let mut write = Some(write);
        loop {
            let UnbufferedStatus { mut discard, state } = self.conn.process_tls_records(&mut self.incoming);
            let mut stop = None;
            let result = match state {
                Err(e) => {
                    drain_front(&mut self.incoming, discard);
                    self.failed = true;
                    self.queue_alert();
                    return Err(tls_error(e));
                }
                Ok(ConnectionState::ReadTraffic(mut traffic)) => {
                    let mut result = Ok(());
                    while let Some(record) = traffic.next_record() {
                        match record {
                            Ok(record) => {
                                discard += record.discard;
                                let mut payload = record.payload;
                                if let Some(buf) = read.as_deref_mut() {
                                    let n = buf.remaining().min(payload.len());
                                    buf.put_slice(&payload[..n]);
                                    payload = &payload[n..];
                                }
                                self.plaintext.extend_from_slice(payload);
                            }
                            Err(e) => {
                                result = Err(e);
                                break;
                            }
                        }
                    }
                    result
                }
                Ok(ConnectionState::EncodeTlsData(mut data)) => encode_into(&mut self.outgoing, &mut data),
                // The records are in `outgoing`, ahead of anything written after them: as
                // good as sent for rustls' order of things.
                Ok(ConnectionState::TransmitTlsData(data)) => {
                    data.done();
                    Ok(())
                }
                Ok(ConnectionState::BlockedHandshake) => {
                    stop = Some(Stop::NeedData);
                    Ok(())
                }
                Ok(ConnectionState::PeerClosed) => {
                    self.peer_closed = true;
                    Ok(())
                }
                Ok(ConnectionState::Closed) => {
                    self.peer_closed = true;
                    stop = Some(Stop::Closed);
                    Ok(())
                }
                Ok(ConnectionState::WriteTraffic(mut traffic)) => {
                    stop = Some(Stop::Writable);
                    match write.take().unwrap_or(Write::Nothing) {
                        Write::Nothing => Ok(()),
                        Write::Data(data) => {
                            encrypt_into(&mut self.outgoing, data.len(), |out| traffic.encrypt(data, out))
                        }
                        Write::CloseNotify => {
                            self.closed_for_writing = true;
                            encrypt_into(&mut self.outgoing, 0, |out| traffic.queue_close_notify(out))
                        }
                    }
                }
                // Early data is not enabled (`max_early_data_size` is 0), so this is not
                // reached; refused rather than mishandled if it were.
                Ok(_) => Err(rustls::Error::General("unexpected TLS state (early data?)".into())),
            };
            drain_front(&mut self.incoming, discard);
            if let Err(e) = result {
                self.failed = true;
                return Err(tls_error(e));
            }
            if let Some(stop) = stop {
                return Ok(stop);
            }
        }
    }

    /// After rustls failed, the alert it queued (if any) into `outgoing`, to be sent on the
    /// way out. Only what rustls already queued: rustls is asked again only while it has a
    /// record to give (it returns that before looking at the received bytes again, which
    /// would fail anew).
    fn queue_alert(&mut self) {
        while self.conn.wants_write() {
            let UnbufferedStatus { discard, state } = self.conn.process_tls_records(&mut self.incoming);
            let Ok(ConnectionState::EncodeTlsData(mut data)) = state else {
                drain_front(&mut self.incoming, discard);
                return;
            };
            // Best effort: an alert that cannot be encoded is not sent.
            let _ = encode_into(&mut self.outgoing, &mut data);
            drain_front(&mut self.incoming, discard);
        }
    }

    /// Sends what is in `outgoing`; gives the buffer back once it is all sent.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.outgoing_at < self.outgoing.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.outgoing[self.outgoing_at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.outgoing_at += n;
        }
        if self.outgoing.capacity() > 0 {
            self.outgoing = Vec::new();
        }
        self.outgoing_at = 0;
        Poll::Ready(Ok(()))
    }

    /// Reads what the socket has into `incoming` (through the stack: nothing is allocated
    /// unless bytes came); sets `eof` at its end.
    fn poll_receive(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let room = MAX_INCOMING.saturating_sub(self.incoming.len()).min(READ_CHUNK);
        if room == 0 {
            self.failed = true;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the peer sent {MAX_INCOMING} bytes without finishing a TLS record or handshake message"),
            )));
        }
        // Not zeroed: a read per wake-up would clear 16 KiB for nothing.
        let mut chunk = [std::mem::MaybeUninit::<u8>::uninit(); READ_CHUNK];
        let mut buf = ReadBuf::uninit(&mut chunk[..room]);
        ready!(Pin::new(&mut self.io).poll_read(cx, &mut buf))?;
        if buf.filled().is_empty() {
            self.eof = true;
        } else {
            self.incoming.extend_from_slice(buf.filled());
        }
        Poll::Ready(Ok(()))
    }

    /// Copies read-but-unread plaintext into `buf`; gives the buffer back once it is read.
    fn take_plaintext(&mut self, buf: &mut ReadBuf<'_>) {
        let rest = &self.plaintext[self.plaintext_at..];
        let n = buf.remaining().min(rest.len());
        buf.put_slice(&rest[..n]);
        self.plaintext_at += n;
        if self.plaintext_at == self.plaintext.len() {
            self.plaintext = Vec::new();
            self.plaintext_at = 0;
        }
    }

    fn has_plaintext(&self) -> bool {
        self.plaintext_at < self.plaintext.len()
    }
}

/// Removes the first `n` bytes of `buf`; gives the allocation back when nothing is left.
fn drain_front(buf: &mut Vec<u8>, n: usize) {
    if n >= buf.len() {
        *buf = Vec::new();
    } else if n > 0 {
        buf.drain(..n);
    }
}

/// Appends the record rustls has to send (handshake, alert) to `out`, at the size it asks for;
/// nothing is appended when encoding fails.
fn encode_into<Data>(out: &mut Vec<u8>, data: &mut EncodeTlsData<'_, Data>) -> Result<(), rustls::Error> {
    let start = out.len();
    let need = match data.encode(&mut []) {
        Ok(_) => return Ok(()),
        Err(EncodeError::InsufficientSize(need)) => need.required_size,
        Err(e) => return Err(rustls::Error::General(format!("encoding a TLS record: {e}"))),
    };
    out.resize(start + need, 0);
    match data.encode(&mut out[start..]) {
        Ok(n) => {
            out.truncate(start + n);
            Ok(())
        }
        Err(e) => {
            out.truncate(start);
            Err(rustls::Error::General(format!("encoding a TLS record: {e}")))
        }
    }
}

/// Appends what `encrypt` writes to `out`, growing `out` to what it needs: room for
/// `plaintext` bytes and their records' overhead first, the size rustls asks for if that is
/// not enough.
fn encrypt_into(
    out: &mut Vec<u8>,
    plaintext: usize,
    mut encrypt: impl FnMut(&mut [u8]) -> Result<usize, EncryptError>,
) -> Result<(), rustls::Error> {
    let start = out.len();
    // Per record: header 5, content type 1, tag 16; a key update's answer may go first.
    let guess = plaintext + (plaintext / 16_384 + 1) * 22 + 64;
    out.resize(start + guess, 0);
    let written = match encrypt(&mut out[start..]) {
        Ok(n) => Ok(n),
        Err(EncryptError::InsufficientSize(need)) => {
            out.resize(start + need.required_size, 0);
            encrypt(&mut out[start..])
        }
        Err(e) => Err(e),
    };
    match written {
        Ok(n) => {
            out.truncate(start + n);
            Ok(())
        }
        Err(e) => {
            out.truncate(start);
            Err(rustls::Error::General(format!("encrypting: {e}")))
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for LeanTls<IO> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            // Records rustls wrote while reading (a key update's answer) go out on the way;
            // not waited for here (a write or flush waits).
            if let Poll::Ready(Err(e)) = this.poll_send(cx) {
                return Poll::Ready(Err(e));
            }
            if this.has_plaintext() {
                this.take_plaintext(buf);
                return Poll::Ready(Ok(()));
            }
            if this.peer_closed {
                return Poll::Ready(Ok(()));
            }
            let before = buf.filled().len();
            let stop = match this.process(Some(buf), Write::Nothing) {
                Ok(stop) => stop,
                Err(e) => {
                    // rustls' alert (a bad record, a protocol violation), best effort: the
                    // peer learns why, as from tokio-rustls.
                    let _ = this.poll_send(cx);
                    return Poll::Ready(Err(e));
                }
            };
            if buf.filled().len() > before || this.has_plaintext() {
                // Records rustls wrote meanwhile: on their way before returning.
                if let Poll::Ready(Err(e)) = this.poll_send(cx) {
                    return Poll::Ready(Err(e));
                }
                return Poll::Ready(Ok(()));
            }
            if stop == Stop::Closed || this.peer_closed {
                continue;
            }
            if this.eof {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed connection without sending TLS close_notify",
                )));
            }
            ready!(this.poll_receive(cx))?;
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for LeanTls<IO> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // What was encrypted before goes first: at most one write's worth waits.
        ready!(this.poll_send(cx))?;
        if this.closed_for_writing {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, "TLS connection closed for writing")));
        }
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let data = &data[..data.len().min(MAX_WRITE)];
        match this.process(None, Write::Data(data))? {
            Stop::Writable => {}
            Stop::NeedData | Stop::Closed => {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::NotConnected, "TLS connection is not writable")));
            }
        }
        // On its way now (the caller may not flush); the rest waits for the next write or
        // flush, which registered this task for the socket's room.
        if let Poll::Ready(Err(e)) = this.poll_send(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.closed_for_writing {
            ready!(this.poll_send(cx))?;
            // Once: a connection that cannot say close_notify (it failed) still closes its
            // socket.
            if !this.failed {
                let _ = this.process(None, Write::CloseNotify);
            }
            this.closed_for_writing = true;
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetwatch_certs::{Authority, LeafSpec, TlsFiles};
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio_rustls::client::TlsStream as ClientTls;

    /// A CA, the hub's certificate and an agent's, in a temporary directory.
    struct Pki {
        dir: tempfile::TempDir,
    }

    impl Pki {
        fn new() -> Self {
            fleetwatch_certs::install_crypto_provider();
            let dir = tempfile::tempdir().unwrap();
            Authority::init(dir.path(), "test.local").unwrap();
            let ca = Authority::load(dir.path()).unwrap();
            ca.issue(dir.path(), &LeafSpec::Hub { dns: vec!["localhost".into()], ips: vec![] }, 1).unwrap();
            ca.issue(dir.path(), &LeafSpec::Agent { cluster: "c1".into() }, 1).unwrap();
            Self { dir }
        }

        fn files(&self, stem: &str) -> TlsFiles {
            let d = self.dir.path();
            TlsFiles {
                cert: d.join(format!("{stem}.crt")),
                key: d.join(format!("{stem}.key")),
                ca: vec![d.join("ca.crt")],
            }
        }

        fn server(&self) -> Arc<ServerConfig> {
            Arc::new(fleetwatch_certs::server_config(&self.files("hub")).unwrap())
        }

        fn connector(&self) -> tokio_rustls::TlsConnector {
            tokio_rustls::TlsConnector::from(Arc::new(
                fleetwatch_certs::client_config(&self.files("agent-c1")).unwrap(),
            ))
        }
    }

    /// A handshake over an in-memory pipe of `pipe` bytes each way (small: partial reads
    /// and writes on both ends).
    async fn connect(pki: &Pki, pipe: usize) -> (LeanTls<DuplexStream>, ClientTls<DuplexStream>) {
        let (client_io, server_io) = tokio::io::duplex(pipe);
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let (server, client) =
            tokio::join!(LeanTls::accept(server_io, pki.server()), pki.connector().connect(name, client_io));
        (server.unwrap(), client.unwrap())
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    /// Echoes what it reads until the peer's end, then closes with close_notify.
    async fn echo(server: &mut LeanTls<DuplexStream>) -> usize {
        let mut buf = vec![0u8; 1000];
        let mut total = 0;
        loop {
            let n = server.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            total += n;
            server.write_all(&buf[..n]).await.unwrap();
            server.flush().await.unwrap();
        }
        server.shutdown().await.unwrap();
        total
    }

    #[tokio::test]
    async fn a_verified_client_is_served_large_messages_both_ways_and_closes_cleanly() {
        let pki = Pki::new();
        let (mut server, client) = connect(&pki, 4096).await;
        // The identity comes from the chain rustls verified.
        let chain = server.peer_certificates().expect("the client's certificate");
        let peer = fleetwatch_certs::peer_certificate(chain).unwrap();
        assert_eq!(peer.identity.to_string(), "spiffe://test.local/cluster/c1");
        // Messages larger than a record and than the pipe, so every write and read is
        // partial somewhere.
        let message = pattern(300_000, 7);
        let (mut rd, mut wr) = tokio::io::split(client);
        let sent = message.clone();
        let writer = tokio::spawn(async move {
            for chunk in sent.chunks(70_000) {
                wr.write_all(chunk).await.unwrap();
            }
            wr.flush().await.unwrap();
            wr.shutdown().await.unwrap(); // close_notify
        });
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            // Ends at the server's close_notify: an end without one is an error here.
            rd.read_to_end(&mut got).await.unwrap();
            got
        });
        assert_eq!(echo(&mut server).await, message.len());
        writer.await.unwrap();
        assert_eq!(reader.await.unwrap(), message);
        assert_eq!(server.buffered_capacity(), 0, "buffers given back at the end");
    }

    #[tokio::test]
    async fn an_idle_connection_holds_no_buffer() {
        let pki = Pki::new();
        let (mut server, mut client) = connect(&pki, 64 << 10).await;
        // The handshake's and the first messages' buffers are given back.
        client.write_all(&pattern(20_000, 1)).await.unwrap();
        client.flush().await.unwrap();
        let mut got = vec![0u8; 20_000];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(got, pattern(20_000, 1));
        server.write_all(&pattern(50_000, 2)).await.unwrap();
        server.flush().await.unwrap();
        let mut back = vec![0u8; 50_000];
        client.read_exact(&mut back).await.unwrap();
        assert_eq!(back, pattern(50_000, 2));
        assert_eq!(server.buffered_capacity(), 0, "an idle connection holds no TLS buffer");
        // A read waiting on an idle connection holds none either.
        let read = tokio::time::timeout(std::time::Duration::from_millis(20), server.read(&mut got)).await;
        assert!(read.is_err(), "nothing to read");
        assert_eq!(server.buffered_capacity(), 0);
        // Half a record arrived: kept until the rest comes, then given back.
        client.write_all(b"x").await.unwrap();
        client.flush().await.unwrap();
        let n = server.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], b"x");
        assert_eq!(server.buffered_capacity(), 0);
    }

    #[tokio::test]
    async fn key_updates_from_the_client_are_answered_and_traffic_goes_on() {
        let pki = Pki::new();
        let (mut server, mut client) = connect(&pki, 128 << 10).await;
        for round in 0..5u8 {
            // A TLS 1.3 KeyUpdate asking the server to update its keys too.
            client.get_mut().1.refresh_traffic_keys().unwrap();
            let message = pattern(40_000, round);
            client.write_all(&message).await.unwrap();
            client.flush().await.unwrap();
            let mut got = vec![0u8; message.len()];
            server.read_exact(&mut got).await.unwrap();
            assert_eq!(got, message);
            // The server's answer goes before its data: the client decrypts what follows
            // with the server's new keys.
            server.write_all(&message).await.unwrap();
            server.flush().await.unwrap();
            let mut back = vec![0u8; message.len()];
            client.read_exact(&mut back).await.unwrap();
            assert_eq!(back, message, "round {round}");
        }
    }

    #[tokio::test]
    async fn an_oversized_record_is_refused_after_the_handshake() {
        let pki = Pki::new();
        let (mut server, mut client) = connect(&pki, 64 << 10).await;
        // An application-data record header claiming 32 KiB (TLS allows 16 KiB + 256),
        // then a stream of bytes: refused at the header, nothing buffered for it.
        let raw = client.get_mut().0;
        raw.write_all(&[0x17, 0x03, 0x03, 0x80, 0x00]).await.unwrap();
        raw.write_all(&[0u8; 20_000]).await.unwrap();
        let err = server.read(&mut [0u8; 100]).await.unwrap_err();
        let rustls_err = fleetwatch_certs::tls_error::find_rustls(&err).expect("a TLS error");
        assert!(matches!(rustls_err, rustls::Error::InvalidMessage(_)), "{rustls_err:?}");
        // The client was told why, by the read that failed (the server is not polled again
        // before this: without the alert the client would wait for ever).
        let err = client.read(&mut [0u8; 10]).await.unwrap_err();
        assert!(
            matches!(fleetwatch_certs::tls_error::find_rustls(&err), Some(rustls::Error::AlertReceived(_))),
            "{err}"
        );
        // And the connection stays refused.
        assert!(server.read(&mut [0u8; 100]).await.is_err());
    }

    #[tokio::test]
    async fn garbage_instead_of_a_client_hello_fails_the_handshake() {
        let pki = Pki::new();
        let (mut client, server_io) = tokio::io::duplex(64 << 10);
        let accept = tokio::spawn(LeanTls::accept(server_io, pki.server()));
        // An HTTP request where a ClientHello belongs.
        client.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let err = accept.await.unwrap().err().expect("refused");
        assert!(fleetwatch_certs::tls_error::find_rustls(&err).is_some(), "{err}");
        // A handshake record announcing a handshake message larger than TLS allows.
        let (mut client, server_io) = tokio::io::duplex(64 << 10);
        let accept = tokio::spawn(LeanTls::accept(server_io, pki.server()));
        client.write_all(&[0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0xff, 0xff, 0xff]).await.unwrap();
        let err = accept.await.unwrap().err().expect("refused");
        assert!(fleetwatch_certs::tls_error::find_rustls(&err).is_some(), "{err}");
    }

    #[tokio::test]
    async fn a_client_the_ca_did_not_sign_is_refused_with_an_alert() {
        let pki = Pki::new();
        let other = Pki::new();
        let (client_io, server_io) = tokio::io::duplex(64 << 10);
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        // The other CA's agent, trusting this CA's hub certificate.
        let mut files = other.files("agent-c1");
        files.ca = vec![pki.dir.path().join("ca.crt")];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(fleetwatch_certs::client_config(&files).unwrap()));
        let (server, client) = tokio::join!(LeanTls::accept(server_io, pki.server()), async {
            // TLS 1.3: the client learns of the refusal on its first read.
            let mut tls = connector.connect(name, client_io).await?;
            tls.read(&mut [0u8; 10]).await
        });
        let err = server.err().expect("refused");
        assert!(
            matches!(fleetwatch_certs::tls_error::find_rustls(&err), Some(rustls::Error::InvalidCertificate(_))),
            "{err}"
        );
        let err = client.expect_err("the client is told");
        assert!(
            matches!(fleetwatch_certs::tls_error::find_rustls(&err), Some(rustls::Error::AlertReceived(_))),
            "the server's alert reached the client: {err}"
        );
    }

    #[tokio::test]
    async fn a_peer_that_leaves_without_close_notify_is_an_unexpected_end() {
        let pki = Pki::new();
        let (mut server, client) = connect(&pki, 64 << 10).await;
        let (raw, _) = client.into_inner();
        drop(raw);
        let err = server.read(&mut [0u8; 10]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}
