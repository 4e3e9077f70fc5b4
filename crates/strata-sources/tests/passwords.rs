//! Password resolution through the real process environment, and no password in any output.
//! One test function: it changes environment variables, which other threads must not race.

mod common;

use common::*;
use strata_sources::*;

fn set_mode(p: &std::path::Path, mode: u32) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    #[cfg(not(unix))]
    let _ = (p, mode);
}

#[tokio::test]
async fn passwords_come_from_the_environment_and_never_leak() {
    let Some(pg) = pg_spec("pg_pw") else { return };
    let Some(my) = mysql_spec("my_pw") else {
        return;
    };
    let pg_password = pg.password.clone().unwrap();
    let my_password = my.password.clone().unwrap();
    let pg_nopw = ConnectionSpec {
        password: None,
        ..pg.clone()
    };
    let my_nopw = ConnectionSpec {
        password: None,
        ..my.clone()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut outputs: Vec<String> = Vec::new();

    // PGPASSWORD.
    std::env::remove_var("PGPASSFILE");
    std::env::set_var("PGPASSWORD", pg_password.expose());
    let r = pg_nopw.resolve_password().unwrap();
    assert_eq!(r.origin, PasswordOrigin::EnvVar("PGPASSWORD"));
    let src = Source::connect(&pg_nopw).await.expect("PGPASSWORD works");
    outputs.push(format!("{src:?} {r:?} {}", r.origin));

    // A pgpass file named by PGPASSFILE (escapes in the password are undone).
    std::env::remove_var("PGPASSWORD");
    let pgpass = dir.path().join("pgpass");
    let escaped = pg_password
        .expose()
        .replace('\\', "\\\\")
        .replace(':', "\\:");
    std::fs::write(
        &pgpass,
        format!(
            "# strata test\nother:1:x:y:nope\n{}:{}:*:{}:{escaped}\n",
            pg.host,
            pg.port(),
            pg.user
        ),
    )
    .unwrap();
    set_mode(&pgpass, 0o600);
    std::env::set_var("PGPASSFILE", &pgpass);
    let r = pg_nopw.resolve_password().unwrap();
    assert_eq!(
        r.origin,
        PasswordOrigin::File {
            path: pgpass.clone(),
            line: 3
        }
    );
    Source::connect(&pg_nopw).await.expect("pgpass works");

    // The same file readable by others is ignored, as libpq does: no password, and the error
    // says where strata looked.
    set_mode(&pgpass, 0o644);
    let e = Source::connect(&pg_nopw).await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, SourceError::NoPassword { .. }), "{text}");
    assert!(
        text.contains("pg_pw")
            && text.contains("group or world access")
            && text.contains("PGPASSWORD"),
        "{text}"
    );
    outputs.push(format!("{text} {e:?}"));
    std::env::remove_var("PGPASSFILE");

    // A wrong explicit password: the error names the connection, never the password.
    let wrong = ConnectionSpec {
        password: Some(Secret::new("Wr0ng-Pa55word-xyz")),
        ..pg.clone()
    };
    let e = Source::connect(&wrong).await.unwrap_err();
    outputs.push(format!("{e} {e:?} {wrong:?}"));
    assert!(e.to_string().contains("pg_pw"), "{e}");
    let cdc = PgCdc::connect(
        &pg,
        CdcConfig::new(
            "pw_slot_unused",
            "pw_pub_unused",
            vec![TableRef::new("public", "x")],
        ),
    )
    .await
    .unwrap();
    outputs.push(format!("{cdc:?}"));

    // MYSQL_PWD, then ~/.my.cnf.
    std::env::set_var("MYSQL_PWD", my_password.expose());
    assert_eq!(
        my_nopw.resolve_password().unwrap().origin,
        PasswordOrigin::EnvVar("MYSQL_PWD")
    );
    let src = Source::connect(&my_nopw).await.expect("MYSQL_PWD works");
    outputs.push(format!("{src:?}"));
    std::env::remove_var("MYSQL_PWD");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::write(
        home.join(".my.cnf"),
        format!("[client]\npassword=\"{}\"\n", my_password.expose()),
    )
    .unwrap();
    set_mode(&home.join(".my.cnf"), 0o600);
    let old_home = std::env::var_os("HOME");
    std::env::set_var("HOME", &home);
    let r = my_nopw.resolve_password().unwrap();
    assert!(
        matches!(r.origin, PasswordOrigin::File { line: 2, .. }),
        "{:?}",
        r.origin
    );
    Source::connect(&my_nopw).await.expect("~/.my.cnf works");
    std::fs::remove_file(home.join(".my.cnf")).unwrap();
    let e = Source::connect(&my_nopw).await.unwrap_err();
    assert!(matches!(e, SourceError::NoPassword { .. }), "{e}");
    assert!(
        e.to_string().contains("MYSQL_PWD") && e.to_string().contains("my_pw"),
        "{e}"
    );
    outputs.push(format!("{e} {e:?}"));
    match old_home {
        Some(h) => std::env::set_var("HOME", h),
        None => std::env::remove_var("HOME"),
    }
    let wrong = ConnectionSpec {
        password: Some(Secret::new("Wr0ng-Pa55word-xyz")),
        ..my.clone()
    };
    let e = Source::connect(&wrong).await.unwrap_err();
    outputs.push(format!("{e} {e:?} {wrong:?} {my:?} {pg:?}"));

    for o in &outputs {
        for secret in [
            pg_password.expose(),
            my_password.expose(),
            "Wr0ng-Pa55word-xyz",
        ] {
            assert!(!o.contains(secret), "a password leaked into: {o}");
        }
    }
}
