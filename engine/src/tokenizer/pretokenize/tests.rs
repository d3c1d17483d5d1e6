//! Each split's tricky cases; the expected pieces are what the reference
//! tokenizer's regex split gives for the same text.

use super::*;

fn pieces(pre: Option<&str>, text: &str) -> Vec<String> {
    let s = Split::named(pre).unwrap_or_else(|e| unreachable!("{e}"));
    let mut out = Vec::new();
    s.split(text, &mut |p| out.push(p.to_string()));
    assert_eq!(out.concat(), text, "the pieces cover the text");
    out
}

#[test]
fn gpt2_split() {
    let p = |t| pieces(None, t);
    assert_eq!(p("Hello world"), ["Hello", " world"]);
    assert_eq!(p("don't I'M"), ["don", "'t", " I", "'", "M"]);
    assert_eq!(p("a   b"), ["a", "  ", " b"]);
    assert_eq!(p("a\n\nb"), ["a", "\n", "\n", "b"]);
    assert_eq!(p("x  "), ["x", "  "]);
    assert_eq!(p("3.14 !!?"), ["3", ".", "14", " !!?"]);
    assert_eq!(p("café 日本"), ["café", " 日本"]);
    assert_eq!(p(""), Vec::<String>::new());
    assert_eq!(pieces(Some("smollm"), "a   b"), ["a", "  ", " b"]);
}

#[test]
fn llama3_split() {
    let p = |t| pieces(Some("llama-bpe"), t);
    assert_eq!(
        p("don't I'M WE'LL 'sup"),
        ["don", "'t", " I", "'M", " WE", "'LL", " '", "sup"]
    );
    assert_eq!(p("1234567 x12"), ["123", "456", "7", " x", "12"]);
    assert_eq!(
        p("a  \n\n  b\r\n\tc  "),
        ["a", "  \n\n", " ", " b", "\r\n", "\tc", "  "]
    );
    assert_eq!(p("!!\n\n x ?!\r\n"), ["!!\n\n", " x", " ?!\r\n"]);
    assert_eq!(
        p("\u{a0}word \u{301}abc e\u{301}"),
        ["\u{a0}word", " \u{301}", "abc", " e", "\u{301}"]
    );
    assert_eq!(p("'\u{17f} 'Re"), ["'\u{17f}", " '", "Re"]);
    assert_eq!(pieces(Some("llama3"), "x12"), pieces(Some("dbrx"), "x12"));
}

#[test]
fn qwen_splits() {
    assert_eq!(
        pieces(Some("qwen2"), "1234567 x12"),
        ["1", "2", "3", "4", "5", "6", "7", " x", "1", "2"]
    );
    assert_eq!(pieces(Some("deepseek-r1-qwen"), "don't"), ["don", "'t"]);
    assert_eq!(
        pieces(Some("qwen35"), "e\u{301}t\u{301} \u{301}a !\u{301}"),
        ["e\u{301}t\u{301}", " \u{301}a", " !", "\u{301}"]
    );
}

#[test]
fn gpt4o_split() {
    let p = |t| pieces(Some("gpt-4o"), t);
    assert_eq!(
        p("don't I'M WE'LL 'sup"),
        ["don't", " I'M", " WE'LL", " '", "sup"]
    );
    assert_eq!(
        p("HelloWorld HELLOworld helloWORLD"),
        ["Hello", "World", " HELLOworld", " hello", "WORLD"]
    );
    assert_eq!(
        p("1234567 a/b//\n\nc"),
        ["123", "456", "7", " a", "/b", "//\n\n", "c"]
    );
    assert_eq!(
        p("\u{301} \u{301}x \u{1c5}a \u{2b0}\u{2b0}A"),
        ["\u{301}", " \u{301}x", " \u{1c5}a", " \u{2b0}\u{2b0}", "A"]
    );
    assert_eq!(
        p("a  \n\n  b\r\n\tc  "),
        ["a", "  \n\n", " ", " b", "\r\n", "\tc", "  "]
    );
    assert_eq!(
        pieces(Some("tekken"), "don't I'M 12345 a/b//\nc"),
        ["don", "'t", " I", "'M", " ", "1", "2", "3", "4", "5", " a", "/b", "//\n", "c"]
    );
}
