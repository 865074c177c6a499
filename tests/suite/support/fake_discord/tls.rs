//! The fake's HTTPS proxy: `CONNECT discord.com:443` tunnels that end in TLS with a test CA.

use super::*;

/// What a client sees when its HTTPS proxy is the fake: `CONNECT discord.com:443` tunnels end in
/// TLS with a certificate for `discord.com` signed by a test CA, and the requests inside go on to
/// the fake. serenity's production path (no `proxy()`, ratelimiter on) can then be tested.
pub struct TlsInterceptor {
    /// `http://127.0.0.1:P`, for `reqwest::Proxy::https`.
    pub proxy_url: String,
    /// The test CA, PEM.
    pub root_pem: String,
    tunnels: Arc<Mutex<Vec<String>>>,
}

impl TlsInterceptor {
    /// The request line of every CONNECT, in order.
    pub fn tunnels(&self) -> Vec<String> {
        self.tunnels.lock().unwrap().clone()
    }
}

impl FakeDiscord {
    /// Starts a [`TlsInterceptor`] in front of this fake.
    pub fn intercept_tls(&self) -> TlsInterceptor {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        use tokio_rustls::rustls;

        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["discord.com".to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let proxy_url = format!("http://{}", listener.local_addr().unwrap());
        let tunnels = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&tunnels);
        let upstream = self.addr;
        self.server.runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((client, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    let _ = tunnel(client, acceptor, upstream, seen).await;
                });
            }
        });
        TlsInterceptor {
            proxy_url,
            root_pem: ca.pem(),
            tunnels,
        }
    }
}

async fn tunnel(
    mut client: tokio::net::TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    upstream: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        if client.read(&mut byte).await? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let request_line = head.lines().next().unwrap_or_default().to_owned();
    seen.lock().unwrap().push(request_line.clone());
    if !request_line.starts_with("CONNECT discord.com:443 ") {
        client
            .write_all(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
            .await?;
        return Ok(());
    }
    client
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await?;
    let mut tls = acceptor.accept(client).await?;
    let mut plain = tokio::net::TcpStream::connect(upstream).await?;
    tokio::io::copy_bidirectional(&mut tls, &mut plain).await?;
    Ok(())
}
