"""Test certificates, made afresh by every run and written to a temporary directory (no private
key is ever committed): two CAs, a server certificate for localhost / 127.0.0.1, and client
certificates: one the broker trusts, one expired, one from a CA it does not trust, one for a user
that does not exist. EC P-256 keys, PEM (PKCS#8), as both brokers read them."""

import datetime
import ipaddress
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The subject of the trusted client certificate; RabbitMQ's distinguished_name login formats it
# most specific first: CLIENT_DN.
CLIENT_CN = "warren-tls-client"
CLIENT_ORG = "warren-tests"
CLIENT_DN = f"CN={CLIENT_CN},O={CLIENT_ORG}"
NOBODY_DN = f"CN=warren-tls-nobody,O={CLIENT_ORG}"


def _name(*pairs):
    return x509.Name([x509.NameAttribute(oid, value) for oid, value in pairs])


class Issued:
    """A certificate and its key, written as <stem>.pem and <stem>.key."""

    def __init__(self, directory, stem, cert, key):
        self.cert_obj, self.key_obj = cert, key
        self.cert = os.path.join(directory, f"{stem}.pem")
        self.key = os.path.join(directory, f"{stem}.key")
        with open(self.cert, "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        with open(self.key, "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))


def _now():
    return datetime.datetime.now(datetime.timezone.utc)


def make_ca(directory, stem, common_name):
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name((NameOID.COMMON_NAME, common_name))
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(days=1))
            .not_valid_after(_now() + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return Issued(directory, stem, cert, key)


def issue(directory, stem, ca, subject, server=False, not_before=None, not_after=None):
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (x509.CertificateBuilder()
               .subject_name(subject).issuer_name(ca.cert_obj.subject)
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(not_before or _now() - datetime.timedelta(days=1))
               .not_valid_after(not_after or _now() + datetime.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return Issued(directory, stem, builder.sign(ca.key_obj, hashes.SHA256()), key)


def issue_node(directory, stem, ca, name):
    """A cluster node's certificate signed by `ca`: a node both accepts links and opens them,
    so it is valid for TLS server and client authentication."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(_name((NameOID.COMMON_NAME, name))).issuer_name(ca.cert_obj.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(days=1))
            .not_valid_after(_now() + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca.key_obj, hashes.SHA256()))
    return Issued(directory, stem, cert, key)


def issue_server(directory, stem, ca):
    """A server certificate for localhost and 127.0.0.1 signed by `ca`."""
    return issue(directory, stem, ca, _name((NameOID.COMMON_NAME, "localhost")), server=True)


class Pki:
    """Everything the TLS tests need, in `directory`."""

    def __init__(self, directory):
        os.makedirs(directory, exist_ok=True)
        self.dir = directory
        self.ca = make_ca(directory, "ca", "warren test CA")
        self.other_ca = make_ca(directory, "other-ca", "warren untrusted CA")
        self.server = issue_server(directory, "server", self.ca)
        self.client = issue(directory, "client", self.ca,
                            _name((NameOID.ORGANIZATION_NAME, CLIENT_ORG),
                                  (NameOID.COMMON_NAME, CLIENT_CN)))
        self.nobody = issue(directory, "nobody", self.ca,
                            _name((NameOID.ORGANIZATION_NAME, CLIENT_ORG),
                                  (NameOID.COMMON_NAME, "warren-tls-nobody")))
        self.stranger = issue(directory, "stranger", self.other_ca,
                              _name((NameOID.ORGANIZATION_NAME, CLIENT_ORG),
                                    (NameOID.COMMON_NAME, CLIENT_CN)))
        self.expired = issue(directory, "expired", self.ca,
                             _name((NameOID.ORGANIZATION_NAME, CLIENT_ORG),
                                   (NameOID.COMMON_NAME, CLIENT_CN)),
                             not_before=_now() - datetime.timedelta(days=10),
                             not_after=_now() - datetime.timedelta(days=1))
