//! A scripted HTTP server on loopback that plays an S3 endpoint badly on
//! purpose: it answers bucket listings (so a probe's reachability check
//! passes) and answers every other request as the test says — an error
//! status, a delay — while it counts requests and the most it had in flight.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// How the server answers a request that is not a listing.
#[derive(Clone, Copy, Debug)]
pub struct Script {
    /// The status of every `HEAD` / `GET` of an object.
    pub status: u16,
    /// How long each such answer takes.
    pub delay: Duration,
}

#[derive(Default)]
struct Counters {
    requests: AtomicUsize,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    stop: AtomicBool,
}

/// A running server; stops accepting when dropped.
pub struct FakeS3 {
    pub endpoint: String,
    counters: Arc<Counters>,
}

impl FakeS3 {
    pub fn start(script: Script) -> FakeS3 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        listener.set_nonblocking(true).unwrap();
        let counters = Arc::new(Counters::default());
        let shared = counters.clone();
        std::thread::spawn(move || {
            while !shared.stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let counters = shared.clone();
                        std::thread::spawn(move || serve(stream, script, &counters));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FakeS3 { endpoint, counters }
    }

    /// Object requests answered so far.
    pub fn requests(&self) -> usize {
        self.counters.requests.load(Ordering::SeqCst)
    }

    /// The most object requests that were in flight at once.
    pub fn most_in_flight(&self) -> usize {
        self.counters.most_in_flight.load(Ordering::SeqCst)
    }
}

impl Drop for FakeS3 {
    fn drop(&mut self) {
        self.counters.stop.store(true, Ordering::Relaxed);
    }
}

const LISTING: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
<ListBucketResult>\
<Name>b</Name><Prefix></Prefix><KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys>\
<IsTruncated>false</IsTruncated></ListBucketResult>";

/// Answers the requests of one keep-alive connection.
fn serve(stream: TcpStream, script: Script, counters: &Counters) {
    stream.set_nodelay(true).ok();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut body_length = 0usize;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            if header == "\r\n" {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                body_length = value.trim().parse().unwrap_or(0);
            }
        }
        if body_length > 0 {
            let mut body = vec![0; body_length];
            if std::io::Read::read_exact(&mut reader, &mut body).is_err() {
                return;
            }
        }
        let mut words = request_line.split_whitespace();
        let method = words.next().unwrap_or("");
        let target = words.next().unwrap_or("");
        let response = if method == "GET" && target.contains("list-type=2") {
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n{LISTING}",
                LISTING.len()
            )
        } else {
            counters.requests.fetch_add(1, Ordering::SeqCst);
            let now = counters.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            counters.most_in_flight.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(script.delay);
            counters.in_flight.fetch_sub(1, Ordering::SeqCst);
            format!(
                "HTTP/1.1 {} Scripted\r\nContent-Length: 0\r\n\r\n",
                script.status
            )
        };
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}
