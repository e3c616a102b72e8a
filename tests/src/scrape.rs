//! Reading a Prometheus text exposition, as a scraper sees it: from a real `/metrics` endpoint
//! or from a string a recorder rendered.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One scrape: every sample by its series (`name{labels}` as written), and every metric name
/// that has a `# TYPE` line.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    pub samples: BTreeMap<String, f64>,
    pub names: BTreeSet<String>,
    pub text: String,
}

impl Scrape {
    pub fn parse(text: &str) -> Scrape {
        let mut scrape = Scrape {
            text: text.to_string(),
            ..Scrape::default()
        };
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                if let Some(name) = rest.split_whitespace().next() {
                    scrape.names.insert(name.to_string());
                }
            } else if !line.starts_with('#')
                && let Some((series, value)) = line.rsplit_once(' ')
                && let Ok(value) = value.parse::<f64>()
            {
                scrape.samples.insert(series.to_string(), value);
            }
        }
        scrape
    }

    /// The sum of `name`'s samples whose labels include every one of `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(series, _)| {
                let (series_name, series_labels) = series.split_once('{').unwrap_or((series, ""));
                series_name == name
                    && labels
                        .iter()
                        .all(|(k, v)| series_labels.contains(&format!("{k}=\"{v}\"")))
            })
            .map(|(_, v)| v)
            .sum()
    }
}

/// GET /metrics at `addr`.
pub async fn scrape(addr: SocketAddr) -> Scrape {
    let mut socket = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to /metrics");
    socket
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    socket.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    Scrape::parse(body)
}

#[cfg(test)]
mod tests {
    use super::Scrape;

    #[test]
    fn sums_the_series_with_the_labels_asked_for() {
        let s = Scrape::parse(
            "# TYPE a_total counter\na_total{x=\"1\",y=\"2\"} 3\na_total{x=\"1\",y=\"3\"} 4\nb 1.5\n",
        );
        assert_eq!(s.sum("a_total", &[("x", "1")]), 7.0);
        assert_eq!(s.sum("a_total", &[("y", "3")]), 4.0);
        assert_eq!(s.sum("b", &[]), 1.5);
        assert_eq!(s.sum("a", &[]), 0.0);
        assert!(s.names.contains("a_total") && !s.names.contains("b"));
    }
}
