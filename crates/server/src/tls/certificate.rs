//! What warren reads from an X.509 certificate: its subject, as the user name of a SASL EXTERNAL
//! login, and its validity, for the log.
//!
//! The subject is formatted exactly as RabbitMQ's `rabbit_ssl` does it, so that the user names
//! an operator creates for certificate logins are the same on both brokers:
//! - `distinguished_name` (RabbitMQ's default `ssl_cert_login_from`): RFC 4514, the RDNs in
//!   reverse order (most specific first) joined by `,`, the attributes of a multi-valued RDN
//!   joined by `+`, known attribute types by their short names (`CN`, `O`, `OU`, `DC`, ...),
//!   unknown ones in dotted decimal; `"+,;<>\` escaped with a backslash, a leading space or `#`
//!   and a trailing space too, and bytes below 32 or from 126 up as `\XX` (so a UTF-8 `é` is
//!   `\C3\A9`).
//! - `common_name`: the values of the CN attributes, unescaped, joined by `,`.
//!
//! Only the few DER structures on the way to the subject and validity are decoded, each
//! length checked against what is left, so a malformed certificate is an error, never a panic.
//! (rustls has already verified the certificate's signature when this runs.)

use crate::node::config::CertLoginFrom;

/// The parts of a certificate this module reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateInfo {
    /// The subject's RDNs in certificate order; each a set of (attribute type OID, value).
    subject: Vec<Vec<Attribute>>,
    /// notBefore and notAfter, seconds since the Unix epoch.
    pub not_before_s: i64,
    pub not_after_s: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Attribute {
    /// The OID's DER content bytes.
    oid: Vec<u8>,
    /// The value as UTF-8 bytes (string types converted), or the whole TLV of a non-string.
    value: Vec<u8>,
    is_string: bool,
}

const TAG_INTEGER: u8 = 0x02;
const TAG_OID: u8 = 0x06;
const TAG_UTF8_STRING: u8 = 0x0C;
const TAG_NUMERIC_STRING: u8 = 0x12;
const TAG_PRINTABLE_STRING: u8 = 0x13;
const TAG_TELETEX_STRING: u8 = 0x14;
const TAG_IA5_STRING: u8 = 0x16;
const TAG_UTC_TIME: u8 = 0x17;
const TAG_GENERALIZED_TIME: u8 = 0x18;
const TAG_VISIBLE_STRING: u8 = 0x1A;
const TAG_UNIVERSAL_STRING: u8 = 0x1C;
const TAG_BMP_STRING: u8 = 0x1E;
const TAG_SEQUENCE: u8 = 0x30;
const TAG_SET: u8 = 0x31;
const TAG_VERSION: u8 = 0xA0;

/// The DER contents of OID 2.5.4.3, id-at-commonName.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// RabbitMQ's short names for attribute types (rabbit_ssl:format_rdn), by OID contents.
const ATTRIBUTE_NAMES: [(&[u8], &str); 17] = [
    (&[0x55, 0x04, 0x04], "SN"),
    (&[0x55, 0x04, 0x2A], "GIVENNAME"),
    (&[0x55, 0x04, 0x2B], "INITIALS"),
    (&[0x55, 0x04, 0x2C], "GENERATIONQUALIFIER"),
    (OID_COMMON_NAME, "CN"),
    (&[0x55, 0x04, 0x07], "L"),
    (&[0x55, 0x04, 0x08], "ST"),
    (&[0x55, 0x04, 0x0A], "O"),
    (&[0x55, 0x04, 0x0B], "OU"),
    (&[0x55, 0x04, 0x0C], "TITLE"),
    (&[0x55, 0x04, 0x06], "C"),
    (&[0x55, 0x04, 0x05], "SERIALNUMBER"),
    (&[0x55, 0x04, 0x41], "PSEUDONYM"),
    (
        &[0x09, 0x92, 0x26, 0x89, 0x93, 0xF2, 0x2C, 0x64, 0x01, 0x19],
        "DC",
    ),
    (
        &[0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x09, 0x01],
        "EMAILADDRESS",
    ),
    (&[0x55, 0x04, 0x09], "STREET"),
    (
        &[0x09, 0x92, 0x26, 0x89, 0x93, 0xF2, 0x2C, 0x64, 0x01, 0x01],
        "UID",
    ),
];

/// A certificate's structure was not what X.509 says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed certificate: {}", self.0)
    }
}

/// Reads DER tag-length-value items from a slice.
struct Der<'a>(&'a [u8]);

impl<'a> Der<'a> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn peek_tag(&self) -> Option<u8> {
        self.0.first().copied()
    }

    /// The next item: (tag, contents, the whole TLV).
    fn next(&mut self) -> Result<(u8, &'a [u8], &'a [u8]), Malformed> {
        let data = self.0;
        let tag = *data.first().ok_or(Malformed("truncated"))?;
        let first = *data.get(1).ok_or(Malformed("truncated length"))?;
        let (len, header) = if first < 0x80 {
            (first as usize, 2)
        } else {
            // Long form: 1 to 4 length bytes are plenty for a certificate.
            let n = (first & 0x7F) as usize;
            if n == 0 || n > 4 {
                return Err(Malformed("unsupported length"));
            }
            let bytes = data.get(2..2 + n).ok_or(Malformed("truncated length"))?;
            let len = bytes.iter().fold(0usize, |acc, b| (acc << 8) | *b as usize);
            (len, 2 + n)
        };
        let end = header
            .checked_add(len)
            .filter(|end| *end <= data.len())
            .ok_or(Malformed("length beyond the data"))?;
        self.0 = &data[end..];
        Ok((tag, &data[header..end], &data[..end]))
    }

    fn expect(&mut self, tag: u8, what: &'static str) -> Result<&'a [u8], Malformed> {
        match self.next()? {
            (t, contents, _) if t == tag => Ok(contents),
            _ => Err(Malformed(what)),
        }
    }
}

impl CertificateInfo {
    /// Decodes a DER certificate's subject and validity.
    pub fn parse(der: &[u8]) -> Result<CertificateInfo, Malformed> {
        let certificate = Der(der).expect(TAG_SEQUENCE, "not a certificate")?;
        let tbs = Der(certificate).expect(TAG_SEQUENCE, "no tbsCertificate")?;
        let mut tbs = Der(tbs);
        if tbs.peek_tag() == Some(TAG_VERSION) {
            tbs.next()?;
        }
        tbs.expect(TAG_INTEGER, "no serial number")?;
        tbs.expect(TAG_SEQUENCE, "no signature algorithm")?;
        tbs.expect(TAG_SEQUENCE, "no issuer")?;
        let mut validity = Der(tbs.expect(TAG_SEQUENCE, "no validity")?);
        let not_before_s = parse_time(validity.next()?)?;
        let not_after_s = parse_time(validity.next()?)?;
        let mut name = Der(tbs.expect(TAG_SEQUENCE, "no subject")?);
        let mut subject = Vec::new();
        while !name.is_empty() {
            let mut set = Der(name.expect(TAG_SET, "an RDN is not a SET")?);
            let mut rdn = Vec::new();
            while !set.is_empty() {
                let mut pair = Der(set.expect(TAG_SEQUENCE, "an attribute is not a SEQUENCE")?);
                let oid = pair.expect(TAG_OID, "an attribute type is not an OID")?;
                let (tag, contents, whole) = pair.next()?;
                let (value, is_string) = match string_value(tag, contents) {
                    Some(v) => (v, true),
                    None => (whole.to_vec(), false),
                };
                rdn.push(Attribute {
                    oid: oid.to_vec(),
                    value,
                    is_string,
                });
            }
            subject.push(rdn);
        }
        Ok(CertificateInfo {
            subject,
            not_before_s,
            not_after_s,
        })
    }

    /// The subject as RabbitMQ's `peer_cert_subject` formats it (RFC 4514, reversed).
    pub fn subject_dn(&self) -> String {
        let rdns: Vec<String> = self
            .subject
            .iter()
            .rev()
            .map(|rdn| {
                rdn.iter()
                    .map(format_attribute)
                    .collect::<Vec<_>>()
                    .join("+")
            })
            .collect();
        rdns.join(",")
    }

    /// The CN values joined by `,`, as RabbitMQ's `common_name` login; None without a CN.
    pub fn common_names(&self) -> Option<String> {
        let cns: Vec<String> = self
            .subject
            .iter()
            .flatten()
            .filter(|a| a.oid == OID_COMMON_NAME)
            .map(|a| String::from_utf8_lossy(&a.value).into_owned())
            .collect();
        (!cns.is_empty()).then(|| cns.join(","))
    }

    /// The user name a SASL EXTERNAL login with this certificate stands for; None when the
    /// common name is asked for and there is none (RabbitMQ's "no name found").
    pub fn login_name(&self, from: CertLoginFrom) -> Option<String> {
        match from {
            CertLoginFrom::DistinguishedName => Some(self.subject_dn()),
            CertLoginFrom::CommonName => self.common_names(),
        }
    }
}

/// A string-typed value as UTF-8 bytes; None for a value of another type.
fn string_value(tag: u8, contents: &[u8]) -> Option<Vec<u8>> {
    match tag {
        TAG_UTF8_STRING | TAG_PRINTABLE_STRING | TAG_IA5_STRING | TAG_NUMERIC_STRING
        | TAG_VISIBLE_STRING => Some(contents.to_vec()),
        // Latin-1, as RabbitMQ reads a TeletexString.
        TAG_TELETEX_STRING => Some(
            contents
                .iter()
                .map(|b| *b as char)
                .collect::<String>()
                .into_bytes(),
        ),
        TAG_BMP_STRING => {
            let units: Vec<u16> = contents
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            Some(String::from_utf16_lossy(&units).into_bytes())
        }
        TAG_UNIVERSAL_STRING => Some(
            contents
                .chunks_exact(4)
                .map(|c| {
                    char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                        .unwrap_or(char::REPLACEMENT_CHARACTER)
                })
                .collect::<String>()
                .into_bytes(),
        ),
        _ => None,
    }
}

fn format_attribute(a: &Attribute) -> String {
    let value = if a.is_string {
        escape_rdn_value(&a.value)
    } else {
        // Erlang prints an undecoded value as a binary: <<4,2,...>>.
        let bytes: Vec<String> = a.value.iter().map(|b| b.to_string()).collect();
        format!("<<{}>>", bytes.join(","))
    };
    match ATTRIBUTE_NAMES.iter().find(|(oid, _)| *oid == a.oid) {
        Some((_, name)) => format!("{name}={value}"),
        None => format!("{}={value}", dotted_oid(&a.oid)),
    }
}

/// RFC 4514 escaping as rabbit_ssl:escape_rdn_value does it, byte by byte.
fn escape_rdn_value(v: &[u8]) -> String {
    let mut out = String::with_capacity(v.len());
    for (i, &c) in v.iter().enumerate() {
        let first = i == 0;
        let last = i + 1 == v.len();
        let leading = first && (c == b' ' || c == b'#');
        let trailing = last && c == b' ';
        if leading || trailing || b"\"+,;<>\\".contains(&c) {
            out.push('\\');
            out.push(c as char);
        } else if !(32..126).contains(&c) {
            out.push_str(&format!("\\{c:02X}"));
        } else {
            out.push(c as char);
        }
    }
    out
}

fn dotted_oid(oid: &[u8]) -> String {
    let mut arcs: Vec<u64> = Vec::new();
    let mut acc: u64 = 0;
    for &b in oid {
        acc = (acc << 7) | u64::from(b & 0x7F);
        if b & 0x80 == 0 {
            if arcs.is_empty() {
                let first = (acc / 40).min(2);
                arcs.push(first);
                arcs.push(acc - first * 40);
            } else {
                arcs.push(acc);
            }
            acc = 0;
        }
    }
    arcs.iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(".")
}

/// UTCTime (YYMMDDHHMMSSZ) or GeneralizedTime (YYYYMMDDHHMMSSZ), as Unix seconds.
fn parse_time((tag, contents, _): (u8, &[u8], &[u8])) -> Result<i64, Malformed> {
    let text = std::str::from_utf8(contents).map_err(|_| Malformed("time is not ASCII"))?;
    let digits = text
        .strip_suffix('Z')
        .ok_or(Malformed("time is not in UTC"))?;
    let (year, rest) = match tag {
        TAG_UTC_TIME if digits.len() == 12 => {
            let yy: i64 = digits[..2].parse().map_err(|_| Malformed("bad year"))?;
            // RFC 5280: 50..99 are 19xx, 00..49 are 20xx.
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &digits[2..])
        }
        TAG_GENERALIZED_TIME if digits.len() == 14 => (
            digits[..4].parse().map_err(|_| Malformed("bad year"))?,
            &digits[4..],
        ),
        _ => return Err(Malformed("validity is not a time")),
    };
    let field = |i: usize| -> Result<i64, Malformed> {
        rest[i..i + 2].parse().map_err(|_| Malformed("bad time"))
    };
    let (month, day) = (field(0)?, field(2)?);
    let (hour, minute, second) = (field(4)?, field(6)?, field(8)?);
    Ok(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Unix seconds as `YYYY-MM-DDTHH:MM:SSZ`, for log lines about certificate validity.
pub fn utc_text(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DistinguishedName, DnType, DnValue, KeyPair};

    fn certificate(dn: DistinguishedName) -> Vec<u8> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = dn;
        params.not_before = rcgen::date_time_ymd(2024, 2, 29);
        params.not_after = rcgen::date_time_ymd(2051, 12, 31);
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn distinguished_name_is_reversed_rfc4514_as_rabbitmq_formats_it() {
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CountryName, "DE");
        dn.push(DnType::OrganizationName, "warren tests");
        dn.push(DnType::OrganizationalUnitName, "brokers");
        dn.push(DnType::CommonName, "client-1");
        let info = CertificateInfo::parse(&certificate(dn)).unwrap();
        assert_eq!(
            info.subject_dn(),
            "CN=client-1,OU=brokers,O=warren tests,C=DE"
        );
        assert_eq!(
            info.login_name(CertLoginFrom::CommonName).as_deref(),
            Some("client-1")
        );
    }

    #[test]
    fn special_characters_are_escaped_in_the_dn_but_not_in_the_common_name() {
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, " lead,plus+semi;");
        dn.push(
            DnType::CommonName,
            DnValue::Utf8String("#café <x> \"q\" back\\slash ".into()),
        );
        let info = CertificateInfo::parse(&certificate(dn)).unwrap();
        assert_eq!(
            info.subject_dn(),
            "CN=\\#caf\\C3\\A9 \\<x\\> \\\"q\\\" back\\\\slash\\ ,O=\\ lead\\,plus\\+semi\\;"
        );
        assert_eq!(
            info.common_names().as_deref(),
            Some("#café <x> \"q\" back\\slash ")
        );
    }

    #[test]
    fn unknown_attribute_types_are_dotted_and_no_cn_means_no_common_name() {
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CustomDnType(vec![1, 3, 6, 1, 4, 1, 99999, 7]), "x");
        dn.push(DnType::OrganizationName, "o");
        let info = CertificateInfo::parse(&certificate(dn)).unwrap();
        assert_eq!(info.subject_dn(), "O=o,1.3.6.1.4.1.99999.7=x");
        assert_eq!(info.login_name(CertLoginFrom::CommonName), None);
    }

    #[test]
    fn validity_is_read_in_unix_seconds() {
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "t");
        let info = CertificateInfo::parse(&certificate(dn)).unwrap();
        assert_eq!(utc_text(info.not_before_s), "2024-02-29T00:00:00Z");
        // 2051 is past UTCTime's range, so this one is a GeneralizedTime.
        assert_eq!(utc_text(info.not_after_s), "2051-12-31T00:00:00Z");
        assert_eq!(info.not_before_s, 1_709_164_800);
    }

    #[test]
    fn truncated_or_garbage_input_is_an_error_not_a_panic() {
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "t");
        let der = certificate(dn);
        for len in 0..der.len() {
            let _ = CertificateInfo::parse(&der[..len]);
        }
        assert!(CertificateInfo::parse(&der[..der.len() / 2]).is_err());
        assert!(CertificateInfo::parse(b"AMQP\x00\x00\x09\x01").is_err());
        assert!(CertificateInfo::parse(&[0x30, 0x84, 0xFF, 0xFF, 0xFF, 0xFF]).is_err());
    }
}
