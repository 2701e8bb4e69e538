//! `qe config get|set`: the queue's settings (admin getcfg, setcfg).

use super::data::admin;
use crate::args::ConfigCommand;
use crate::context::Context;
use crate::failure::Failure;
use crate::output::Output;
use qe_client::admin::Settings;
use qe_client::Setting;
use serde_json::{json, Map, Value};

/// Runs one `qe config` command.
pub async fn run(context: &Context, command: ConfigCommand) -> Result<(), Failure> {
    match command {
        ConfigCommand::Get { queue, names } => {
            let settings = admin(context, &queue).await?.config().await?;
            print(context, &settings, &names)
        }
        ConfigCommand::Set { queue, changes } => {
            let changes = changes
                .iter()
                .map(|change| parse_change(change))
                .collect::<Result<Vec<_>, _>>()?;
            let admin = admin(context, &queue).await?;
            admin.set_config(&changes).await?;
            let names: Vec<String> = changes.iter().map(|(s, _)| s.name().to_string()).collect();
            print(context, &admin.config().await?, &names)
        }
    }
}

/// `NAME=VALUE` of a writable setting: an unknown name is not found, a read-only one refused
/// as the queue would (415).
fn parse_change(change: &str) -> Result<(Setting, u64), Failure> {
    let (name, value) = change
        .split_once('=')
        .ok_or_else(|| Failure::Usage(format!("{change:?} is not NAME=VALUE")))?;
    let setting = Setting::parse(name).ok_or_else(|| {
        match qe_shared::settings::ReadOnlySetting::parse(name) {
            Some(_) => Failure::refused(
                qe_client::Code::SettingReadOnly.number(),
                format!("{name} is read-only"),
            ),
            None => Failure::NotFound(format!("no setting {name}: `qe config get` lists them")),
        }
    })?;
    let value = value
        .parse()
        .map_err(|_| Failure::Usage(format!("{name}={value}: not a whole number")))?;
    Ok((setting, value))
}

/// The settings named (all unless any are), as NAME, WRITABLE, VALUE rows and a JSON object.
fn print(context: &Context, settings: &Settings, names: &[String]) -> Result<(), Failure> {
    if let Some(missing) = names.iter().find(|name| settings.get(name).is_none()) {
        return Err(Failure::NotFound(format!("no setting {missing}")));
    }
    let chosen = settings
        .0
        .iter()
        .filter(|setting| names.is_empty() || names.contains(&setting.name));
    let mut rows = Vec::new();
    let mut json = Map::new();
    for setting in chosen {
        rows.push(vec![
            setting.name.clone(),
            setting.writable.to_string(),
            setting.value.clone(),
        ]);
        let value = match setting.value.parse::<u64>() {
            Ok(number) => Value::from(number),
            Err(_) => Value::from(setting.value.clone()),
        };
        json.insert(setting.name.clone(), json!(value));
    }
    Output::new(vec!["NAME", "WRITABLE", "VALUE"], rows, json.into()).print(context.format);
    Ok(())
}
