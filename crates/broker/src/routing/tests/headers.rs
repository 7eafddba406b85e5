//! Routing: headers.

use super::*;

fn headers_match(args: &FieldTable, headers: Option<&FieldTable>) -> bool {
    let mut t = with_exchange(ExchangeKind::Headers);
    t.bind(X, q(1), b"", args).unwrap();
    !routed(&mut t, X, "ignored", headers).is_empty()
}

#[test]
fn headers_all_needs_every_key_and_is_the_default() {
    let all = table(&[("x-match", s("all")), ("a", s("1")), ("b", s("2"))]);
    let default = table(&[("a", s("1")), ("b", s("2"))]);
    for args in [&all, &default] {
        assert!(headers_match(
            args,
            Some(&table(&[("a", s("1")), ("b", s("2"))]))
        ));
        assert!(headers_match(
            args,
            Some(&table(&[("a", s("1")), ("b", s("2")), ("c", s("3"))]))
        ));
        assert!(!headers_match(args, Some(&table(&[("a", s("1"))]))));
        assert!(!headers_match(
            args,
            Some(&table(&[("a", s("1")), ("b", s("3"))]))
        ));
        assert!(!headers_match(args, None));
    }
}

#[test]
fn headers_any_needs_one_key() {
    let any = table(&[("x-match", s("any")), ("a", s("1")), ("b", s("2"))]);
    assert!(headers_match(&any, Some(&table(&[("a", s("1"))]))));
    assert!(headers_match(
        &any,
        Some(&table(&[("a", s("0")), ("b", s("2"))]))
    ));
    assert!(!headers_match(
        &any,
        Some(&table(&[("a", s("0")), ("b", s("0"))]))
    ));
    assert!(!headers_match(&any, Some(&table(&[("c", s("1"))]))));
    assert!(!headers_match(&any, None));
}

#[test]
fn headers_empty_pattern_all_matches_everything_any_nothing() {
    assert!(headers_match(&no_args(), None));
    assert!(headers_match(
        &table(&[("x-match", s("all"))]),
        Some(&table(&[("a", s("1"))]))
    ));
    assert!(!headers_match(
        &table(&[("x-match", s("any"))]),
        Some(&table(&[("a", s("1"))]))
    ));
}

#[test]
fn headers_x_keys_ignored_by_all_and_any_but_not_with_x() {
    let headers = table(&[("x-tenant", s("blue")), ("a", s("1"))]);
    let other_tenant = table(&[("x-tenant", s("red")), ("a", s("1"))]);
    let all = table(&[
        ("x-match", s("all")),
        ("x-tenant", s("blue")),
        ("a", s("1")),
    ]);
    assert!(headers_match(&all, Some(&headers)));
    assert!(
        headers_match(&all, Some(&other_tenant)),
        "all ignores x- keys"
    );
    let all_x = table(&[
        ("x-match", s("all-with-x")),
        ("x-tenant", s("blue")),
        ("a", s("1")),
    ]);
    assert!(headers_match(&all_x, Some(&headers)));
    assert!(!headers_match(&all_x, Some(&other_tenant)));

    let any = table(&[("x-match", s("any")), ("x-tenant", s("blue"))]);
    assert!(
        !headers_match(&any, Some(&headers)),
        "any has nothing left to match"
    );
    let any_x = table(&[
        ("x-match", s("any-with-x")),
        ("x-tenant", s("blue")),
        ("b", s("9")),
    ]);
    assert!(headers_match(&any_x, Some(&headers)));
    assert!(!headers_match(&any_x, Some(&other_tenant)));
    // x-match itself is never compared, even with-x.
    let only_mode = table(&[("x-match", s("all-with-x"))]);
    assert!(headers_match(
        &only_mode,
        Some(&table(&[("x-match", s("any"))]))
    ));
}

#[test]
fn headers_void_pattern_matches_presence() {
    let args = table(&[("flag", AMQPValue::Void)]);
    assert!(headers_match(
        &args,
        Some(&table(&[("flag", s("anything"))]))
    ));
    assert!(headers_match(
        &args,
        Some(&table(&[("flag", AMQPValue::LongLongInt(3))]))
    ));
    assert!(headers_match(
        &args,
        Some(&table(&[("flag", AMQPValue::Void)]))
    ));
    assert!(!headers_match(&args, Some(&table(&[("other", s("x"))]))));
    // A void header does not equal a non-void pattern.
    assert!(!headers_match(
        &table(&[("a", s(""))]),
        Some(&table(&[("a", AMQPValue::Void)]))
    ));
}

#[test]
fn headers_values_compare_as_erlang_terms() {
    let one =
        |v: AMQPValue, h: AMQPValue| headers_match(&table(&[("k", v)]), Some(&table(&[("k", h)])));
    // Every integer type is one kind of number in Erlang.
    assert!(one(AMQPValue::LongInt(1), AMQPValue::LongLongInt(1)));
    assert!(one(AMQPValue::ShortShortUInt(7), AMQPValue::Timestamp(7)));
    assert!(one(
        AMQPValue::LongUInt(u32::MAX),
        AMQPValue::LongLongInt(u32::MAX as i64)
    ));
    assert!(!one(AMQPValue::LongInt(1), AMQPValue::LongLongInt(2)));
    assert!(!one(
        AMQPValue::ShortShortInt(-1),
        AMQPValue::ShortShortUInt(255)
    ));
    // `==` between integer and float compares values.
    assert!(one(AMQPValue::LongInt(1), AMQPValue::Double(1.0)));
    assert!(one(AMQPValue::Float(0.5), AMQPValue::Double(0.5)));
    assert!(!one(AMQPValue::LongInt(1), AMQPValue::Double(1.5)));
    // Strings and byte arrays are both binaries; strings never equal numbers or booleans.
    assert!(one(s("abc"), AMQPValue::ByteArray(b"abc".to_vec().into())));
    assert!(!one(s("1"), AMQPValue::LongInt(1)));
    assert!(!one(s("true"), AMQPValue::Boolean(true)));
    assert!(!one(AMQPValue::Boolean(true), AMQPValue::LongInt(1)));
    assert!(one(AMQPValue::Boolean(false), AMQPValue::Boolean(false)));
    let d = |scale, value| AMQPValue::DecimalValue(DecimalValue { scale, value });
    assert!(one(d(2, 150), d(2, 150)));
    assert!(!one(d(2, 150), d(1, 15)));
    // Nested values keep RabbitMQ's type tag, so there the types must agree.
    let nested = |v: AMQPValue| AMQPValue::FieldTable(table(&[("n", v)]));
    assert!(one(
        nested(AMQPValue::LongInt(1)),
        nested(AMQPValue::LongInt(1))
    ));
    assert!(!one(
        nested(AMQPValue::LongInt(1)),
        nested(AMQPValue::LongLongInt(1))
    ));
    let array = |v: Vec<AMQPValue>| AMQPValue::FieldArray(FieldArray::from(v));
    assert!(one(
        array(vec![s("a"), s("b")]),
        array(vec![s("a"), s("b")])
    ));
    assert!(!one(
        array(vec![s("a"), s("b")]),
        array(vec![s("b"), s("a")])
    ));
    assert!(!one(array(vec![s("a")]), array(vec![s("a"), s("a")])));
}

/// Cases published with pika to RabbitMQ 3.10, and whether it delivered: pika sends Python
/// ints as signed 32-bit (`I`), bytes as byte arrays (`x`), None as void.
#[test]
fn headers_match_what_rabbitmq_delivered() {
    let int = AMQPValue::LongInt;
    let bytes = |b: &[u8]| AMQPValue::ByteArray(b.to_vec().into());
    let cases: Vec<(FieldTable, Option<FieldTable>, bool)> = vec![
        (table(&[("k", int(1))]), Some(table(&[("k", int(1))])), true),
        (
            table(&[("k", int(1))]),
            Some(table(&[("k", int(2))])),
            false,
        ),
        (
            table(&[("k", s("abc"))]),
            Some(table(&[("k", bytes(b"abc"))])),
            true,
        ),
        (
            table(&[("k", s("1"))]),
            Some(table(&[("k", int(1))])),
            false,
        ),
        (
            table(&[("k", AMQPValue::Boolean(true))]),
            Some(table(&[("k", int(1))])),
            false,
        ),
        (
            table(&[("k", AMQPValue::Boolean(true))]),
            Some(table(&[("k", AMQPValue::Boolean(true))])),
            true,
        ),
        (
            table(&[("k", AMQPValue::Void)]),
            Some(table(&[("k", s("anything"))])),
            true,
        ),
        (
            table(&[("k", AMQPValue::Void)]),
            Some(table(&[("j", s("anything"))])),
            false,
        ),
        (
            table(&[("x-match", s("any")), ("a", int(1)), ("b", int(2))]),
            Some(table(&[("b", int(2))])),
            true,
        ),
        (
            table(&[("x-match", s("all")), ("a", int(1)), ("b", int(2))]),
            Some(table(&[("b", int(2))])),
            false,
        ),
        (
            table(&[("x-match", s("all")), ("x-t", s("blue")), ("a", int(1))]),
            Some(table(&[("a", int(1)), ("x-t", s("red"))])),
            true,
        ),
        (
            table(&[
                ("x-match", s("all-with-x")),
                ("x-t", s("blue")),
                ("a", int(1)),
            ]),
            Some(table(&[("a", int(1)), ("x-t", s("red"))])),
            false,
        ),
        (
            table(&[("x-match", s("any")), ("x-t", s("blue"))]),
            Some(table(&[("x-t", s("blue"))])),
            false,
        ),
        (
            table(&[("x-match", s("any-with-x")), ("x-t", s("blue"))]),
            Some(table(&[("x-t", s("blue"))])),
            true,
        ),
        (no_args(), Some(table(&[("a", int(1))])), true),
        (no_args(), None, true),
        (
            table(&[("x-match", s("any"))]),
            Some(table(&[("a", int(1))])),
            false,
        ),
        (
            table(&[("k", AMQPValue::FieldTable(table(&[("n", int(1))])))]),
            Some(table(&[(
                "k",
                AMQPValue::FieldTable(table(&[("n", int(1))])),
            )])),
            true,
        ),
        (
            table(&[("k", AMQPValue::FieldArray(vec![int(1), int(2)].into()))]),
            Some(table(&[(
                "k",
                AMQPValue::FieldArray(vec![int(1), int(2)].into()),
            )])),
            true,
        ),
    ];
    for (args, headers, delivered) in cases {
        assert_eq!(
            headers_match(&args, headers.as_ref()),
            delivered,
            "{args:?} {headers:?}"
        );
    }
}

#[test]
fn headers_invalid_x_match_is_precondition_failed() {
    let mut t = with_exchange(ExchangeKind::Headers);
    let err = t
        .bind(X, q(1), b"", &table(&[("x-match", s("some"))]))
        .unwrap_err();
    assert_eq!(
        err,
        RoutingError::InvalidXMatch {
            value: "some".into()
        }
    );
    assert_eq!(err.reply_code(), 406);
    let err = t
        .bind(X, q(1), b"", &table(&[("x-match", AMQPValue::LongInt(1))]))
        .unwrap_err();
    assert_eq!(err.reply_code(), 406);
    // The texts RabbitMQ 3.10 sent for the same binds.
    assert_eq!(
        err.to_string(),
        "Invalid x-match field type signedint (value 1); expected longstr"
    );
    let err = t
        .bind(X, q(1), b"", &table(&[("x-match", s("some"))]))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Invalid x-match field value <<\"some\">>; expected all, any, all-with-x, or any-with-x"
    );
    assert_eq!(t.binding_count(), 0);
    // Other kinds do not look at x-match, as in RabbitMQ.
    t.declare_exchange(Y, ExchangeKind::Direct).unwrap();
    assert!(t
        .bind(Y, q(1), b"", &table(&[("x-match", s("some"))]))
        .unwrap());
}

#[test]
fn headers_routes_only_matching_bindings() {
    let mut t = with_exchange(ExchangeKind::Headers);
    t.bind(
        X,
        q(1),
        b"",
        &table(&[("format", s("pdf")), ("type", s("report"))]),
    )
    .unwrap();
    t.bind(
        X,
        q(2),
        b"",
        &table(&[
            ("x-match", s("any")),
            ("format", s("zip")),
            ("type", s("log")),
        ]),
    )
    .unwrap();
    t.bind(
        X,
        q(3),
        b"",
        &table(&[("x-match", s("any")), ("format", s("pdf"))]),
    )
    .unwrap();
    let pdf_report = table(&[("format", s("pdf")), ("type", s("report"))]);
    assert_eq!(routed(&mut t, X, "", Some(&pdf_report)), vec![1, 3]);
    let zip_report = table(&[("format", s("zip")), ("type", s("report"))]);
    assert_eq!(routed(&mut t, X, "", Some(&zip_report)), vec![2]);
}
