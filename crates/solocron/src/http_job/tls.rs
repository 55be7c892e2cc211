//! The TLS client of HTTP jobs: rustls on the `ring` provider, chosen here rather than
//! installed process-wide (an embedding program keeps its own default), with the system's
//! roots (read by `rustls-platform-verifier`, as reqwest's own `rustls` feature does) plus
//! a job's CA file. One client per CA bundle, shared by the process.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::CertificateDer;

/// Largest CA file read (a full system bundle is about 220 KiB).
const CA_FILE_BYTES_MAX: u64 = 1024 * 1024;
/// Most distinct CA bundles whose clients are kept for the process; past it, a client is
/// built per run (correct, only slower).
const CLIENTS_CACHED_MAX: usize = 16;

/// The certificates of a PEM file, each checked to be usable as a root.
pub(super) fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let size = std::fs::metadata(path).map_err(|e| format!("cannot read: {e}"))?.len();
    if size > CA_FILE_BYTES_MAX {
        return Err(format!("is {size} bytes; a CA file is at most {CA_FILE_BYTES_MAX}"));
    }
    let pem = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("is not a PEM file of certificates: {e:?}"))?;
    if certs.is_empty() {
        return Err("holds no certificate (-----BEGIN CERTIFICATE-----)".to_owned());
    }
    let mut roots = rustls::RootCertStore::empty();
    for (i, cert) in certs.iter().enumerate() {
        roots.add(cert.clone()).map_err(|e| format!("certificate {} cannot be a root: {e}", i + 1))?;
    }
    Ok(certs)
}

/// The process's clients, one per CA bundle (empty: the system's roots only). A client holds
/// no connection between runs (`pool_max_idle_per_host(0)`), so one can serve every tokio
/// runtime of the process: a pooled connection would belong to the runtime that made it.
static CLIENTS: Mutex<Vec<(Vec<CertificateDer<'static>>, reqwest::Client)>> = Mutex::new(Vec::new());

/// The shared client for a CA bundle, built on first use.
pub(super) fn client_for(ca: &[CertificateDer<'static>]) -> Result<reqwest::Client, String> {
    let mut clients = CLIENTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, c)) = clients.iter().find(|(k, _)| k.as_slice() == ca) {
        return Ok(c.clone());
    }
    let client = build_client(ca)?;
    if clients.len() < CLIENTS_CACHED_MAX {
        clients.push((ca.to_vec(), client.clone()));
    }
    Ok(client)
}

fn build_client(ca: &[CertificateDer<'static>]) -> Result<reqwest::Client, String> {
    use rustls::client::danger::ServerCertVerifier;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = match rustls_platform_verifier::Verifier::new_with_extra_roots(
        ca.iter().cloned(),
        provider.clone(),
    ) {
        Ok(v) => Arc::new(v),
        // A machine without CA certificates (a bare container) still serves http:// jobs;
        // https ones fail their handshake, and the log says why.
        Err(e) if ca.is_empty() => {
            tracing::warn!(error = %e, "no system CA certificates: https endpoints will be refused unless a job sets ca_file");
            Arc::new(NoRoots(provider.clone()))
        }
        Err(e) => return Err(format!("the CA file's certificates: {e}")),
    };
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .user_agent(concat!("solocron/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| e.to_string())
}

/// The verifier of a machine with no roots at all: every certificate is refused.
#[derive(Debug)]
struct NoRoots(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoRoots {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Err(rustls::Error::General("no CA certificates on this system; set the job's ca_file".into()))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
