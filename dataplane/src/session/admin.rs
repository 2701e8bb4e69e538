//! An administrator. The commands arrive with part 4 (issue 5); until then every command is
//! refused as not known, and the connection's rules (JSON only, context) already hold.

use super::request::{self, Parsed};
use super::{as_str, Data, Reply, Response};
use qe_shared::Code;

pub struct Admin;

impl Admin {
    pub fn new() -> Admin {
        Admin
    }

    pub fn handle(&self, data: Data) -> Response {
        let fields = match &data {
            Data::Binary(_) => return Response::abort(Reply::failure(Code::InvalidJson)),
            Data::Text(payload) => match request::parse(as_str(payload)) {
                Parsed::NotJson => return Response::abort(Reply::failure(Code::InvalidJson)),
                Parsed::OtherJson => return Response::reply(Reply::failure(Code::InvalidCommand)),
                Parsed::Object(fields) => fields,
            },
        };
        match request::context(&fields) {
            Ok(context) => Response::reply(Reply::failure(Code::InvalidCommand).context(context)),
            Err(code) => Response::reply(Reply::failure(code)),
        }
    }
}
