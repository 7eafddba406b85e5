//! The `expiration` property parsed as RabbitMQ 3.10's rabbit_basic:parse_expiration does, with
//! the reasons it reports ("invalid expiration 'X': REASON").

use warren_broker::message::{parse_expiration, InvalidExpiration, EXPIRATION_MS_MAX};

fn reason(raw: &str) -> String {
    parse_expiration(raw.as_bytes()).unwrap_err().to_string()
}

#[test]
fn integers_from_zero_to_ten_years_are_accepted() {
    assert_eq!(parse_expiration(b"0"), Ok(0));
    assert_eq!(parse_expiration(b"60000"), Ok(60_000));
    assert_eq!(
        parse_expiration(b"+5"),
        Ok(5),
        "string:to_integer takes a plus sign"
    );
    assert_eq!(parse_expiration(b"007"), Ok(7));
    assert_eq!(parse_expiration(b"-0"), Ok(0));
    assert_eq!(
        parse_expiration(EXPIRATION_MS_MAX.to_string().as_bytes()),
        Ok(EXPIRATION_MS_MAX)
    );
}

#[test]
fn refusals_carry_rabbitmqs_reason() {
    assert_eq!(reason(""), "no_integer");
    assert_eq!(reason("abc"), "no_integer");
    assert_eq!(reason(" 5"), "no_integer");
    assert_eq!(reason("12abc"), "{leftover_string,\"abc\"}");
    assert_eq!(reason("1.5"), "{leftover_string,\".5\"}");
    assert_eq!(reason("-5"), "{value_negative,-5}");
    assert_eq!(reason("315360000001"), "{value_too_large,315360000001}");
    assert_eq!(
        reason("99999999999999999999999"),
        "{value_too_large,99999999999999999999999}"
    );
    assert_eq!(parse_expiration(b"x"), Err(InvalidExpiration::NoInteger));
}
