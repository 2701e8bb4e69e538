//! CSV as RFC 4180 writes it: fields joined by commas, rows ended by CRLF, and a field that
//! holds a comma, a double quote, a CR or an LF enclosed in double quotes, with each quote
//! in it doubled. Labels come from nodes, so none is trusted to be plain.

/// One row, CRLF included.
pub fn row<'a>(fields: impl IntoIterator<Item = &'a str>) -> String {
    let mut row = String::new();
    for (n, field) in fields.into_iter().enumerate() {
        if n > 0 {
            row.push(',');
        }
        push_field(&mut row, field);
    }
    row.push_str("\r\n");
    row
}

fn push_field(row: &mut String, field: &str) {
    if !field.contains([',', '"', '\r', '\n']) {
        row.push_str(field);
        return;
    }
    row.push('"');
    row.push_str(&field.replace('"', "\"\""));
    row.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_that_need_it_are_quoted_and_their_quotes_doubled() {
        assert_eq!(row(["a", "b c", ""]), "a,b c,\r\n");
        assert_eq!(
            row(["eu,west", "say \"hi\"", "two\nlines", "cr\r"]),
            "\"eu,west\",\"say \"\"hi\"\"\",\"two\nlines\",\"cr\r\"\r\n"
        );
    }
}
