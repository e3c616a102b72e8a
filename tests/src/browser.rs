//! A real headless Chromium driven over WebDriver (Debian's `chromium` and `chromium-driver`),
//! for tests of the web console.

use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use tokio::process::{Child, Command};

use crate::db::in_ci;

const DRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// A browser session; the driver and its browser are killed when dropped (also when the test
/// failed before closing the session).
pub struct Browser {
    pub client: Client,
    _driver: Child,
    /// The browser's profile folder, unique to this session: names its processes.
    profile: String,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = std::process::Command::new("pkill")
            .args(["-9", "-f", &self.profile])
            .status();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

impl Browser {
    /// Starts chromedriver and a headless Chromium; `None` (skip) when they are not installed,
    /// which fails the test in CI.
    pub async fn start(what: &str) -> Option<Browser> {
        if !std::path::Path::new(DRIVER).exists() || !std::path::Path::new(CHROMIUM).exists() {
            assert!(
                !in_ci(),
                "{what}: chromium and chromium-driver are not installed (CI=true: browser tests must not be skipped)"
            );
            eprintln!("skipping {what}: chromium and chromium-driver are not installed");
            return None;
        }
        let port = crate::net::free_addr().await.port();
        let driver = Command::new(DRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver");
        let profile = format!("{}/dtx-browser-{port}", std::env::temp_dir().display());
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1400,1000",
                         format!("--user-data-dir={profile}")],
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        for _ in 0..100 {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(client) => {
                    return Some(Browser {
                        client,
                        _driver: driver,
                        profile,
                    });
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        panic!("chromedriver did not start on {url}");
    }

    /// The text of the element `css`, waiting (ten seconds at most) for it to appear: a click
    /// that submits a form returns before the next page is there.
    pub async fn text(&self, css: &str) -> String {
        self.client
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .text()
            .await
            .unwrap()
    }

    /// Clicks `element` (a link or a form's button) and waits until the page it leads to has
    /// loaded: the click returns while the navigation is still under way, and a `goto` right
    /// after it could be overtaken by the page the click asked for.
    pub async fn click_and_load(&self, element: fantoccini::elements::Element) {
        let b = &self.client;
        b.execute("window.dtxLeaving = true; return true", vec![])
            .await
            .unwrap();
        element.click().await.unwrap();
        let loaded = "return window.dtxLeaving === undefined && document.readyState === 'complete'";
        for _ in 0..200 {
            if b.execute(loaded, vec![]).await.ok() == Some(serde_json::Value::Bool(true)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let page = b.source().await.unwrap_or_default();
        panic!(
            "the click led to no new page within 10 s: {}",
            &page[..page.len().min(4000)]
        );
    }

    /// Reloads `url` until the text of `css` contains `needle` (twenty seconds at most).
    pub async fn until_text(&self, url: &str, css: &str, needle: &str) -> String {
        let mut last = String::new();
        for _ in 0..100 {
            self.client.goto(url).await.unwrap();
            if let Ok(e) = self.client.find(Locator::Css(css)).await {
                last = e.text().await.unwrap_or_default();
                if last.contains(needle) {
                    return last;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("{css} at {url} never showed {needle:?}; last: {last}");
    }

    /// Saves a screenshot as `<DTX_CONSOLE_SCREENSHOTS>/<name>.png` when that variable names a
    /// folder (how the README's pictures are made).
    pub async fn screenshot(&self, name: &str) {
        if let Ok(dir) = std::env::var("DTX_CONSOLE_SCREENSHOTS") {
            let png = self.client.screenshot().await.unwrap();
            std::fs::write(std::path::Path::new(&dir).join(format!("{name}.png")), png).unwrap();
        }
    }

    pub async fn close(self) {
        self.client.clone().close().await.ok();
    }
}
