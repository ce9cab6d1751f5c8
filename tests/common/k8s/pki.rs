//! The certificates of one control plane, made with rcgen: a cluster CA that signs the API
//! server's serving certificate and every client's, a front-proxy CA (without the
//! `--requestheader-*` flags the controller manager and scheduler log a missing request-header
//! CA forever), and the service-account signing key. ECDSA P-256 throughout: quick to make,
//! and every component reads it.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use std::net::IpAddr;

/// A CA that can sign leaf certificates.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its private key, both PEM.
#[derive(Clone)]
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
}

fn now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

impl Ca {
    pub fn new(common_name: &str) -> Self {
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = now() - time::Duration::hours(1);
        params.not_after = now() + time::Duration::days(7);
        let key = KeyPair::generate().expect("an ECDSA key");
        Self {
            issuer: CertifiedIssuer::self_signed(params, key).expect("a self-signed CA"),
        }
    }

    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    fn leaf(&self, params: CertificateParams) -> Pair {
        let key = KeyPair::generate().expect("an ECDSA key");
        let cert = params.signed_by(&key, &self.issuer).expect("a signed leaf");
        Pair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    fn params(common_name: &str, organizations: &[&str]) -> CertificateParams {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        for o in organizations {
            params.distinguished_name.push(DnType::OrganizationName, *o);
        }
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.not_before = now() - time::Duration::hours(1);
        params.not_after = now() + time::Duration::days(7);
        params
    }

    /// A serving certificate for these names and addresses.
    pub fn server(&self, common_name: &str, dns: &[&str], ips: &[IpAddr]) -> Pair {
        let mut params = Self::params(common_name, &[]);
        for name in dns {
            params
                .subject_alt_names
                .push(SanType::DnsName((*name).try_into().expect("a DNS name")));
        }
        params
            .subject_alt_names
            .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.leaf(params)
    }

    /// A client certificate: the API server reads the user from the common name and the
    /// groups from the organizations.
    pub fn client(&self, user: &str, groups: &[&str]) -> Pair {
        let mut params = Self::params(user, groups);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.leaf(params)
    }
}

/// The service-account token signing key and its public half (PEM), which the API server
/// verifies tokens with: it does not read a public key out of a PKCS#8 private key.
pub fn service_account_key() -> (String, String) {
    let key = KeyPair::generate().expect("an ECDSA key");
    (key.serialize_pem(), key.public_key_pem())
}
