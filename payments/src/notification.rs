//! What a provider's callback says, parsed and checked for shape before it is compared with
//! anything: identifiers in the key charset, an amount in minor units, a currency code.

use serde::Deserialize;

/// One payment event as the provider reported it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Notification {
    /// The shop's account at the provider.
    pub merchant: String,
    /// The provider's transaction number: unique per merchant.
    pub trade_no: String,
    /// The shop's order the payment is for.
    pub order_no: String,
    /// In minor units (cents): never a float.
    pub amount: i64,
    /// ISO 4217, upper case.
    pub currency: String,
    /// What happened, e.g. `payment.succeeded`.
    pub event_type: String,
}

/// Longest merchant, trade number, order number and event type.
pub const MAX_ID: usize = 64;

impl Notification {
    /// The default body format: a JSON object with exactly these fields
    /// (`{"merchant", "trade_no", "order_no", "amount", "currency", "event_type"}`), unknown
    /// fields ignored.
    pub fn from_json(body: &[u8]) -> Result<Self, String> {
        let notification: Notification = serde_json::from_slice(body)
            .map_err(|e| format!("the body is not a notification: {e}"))?;
        notification.check()?;
        Ok(notification)
    }

    /// The shape every notification must have, whatever its format.
    pub fn check(&self) -> Result<(), String> {
        for (field, value) in [
            ("merchant", &self.merchant),
            ("trade_no", &self.trade_no),
            ("order_no", &self.order_no),
            ("event_type", &self.event_type),
        ] {
            let ok = !value.is_empty()
                && value.len() <= MAX_ID
                && value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !ok {
                return Err(format!("{field} {value:?}: 1..={MAX_ID} of [A-Za-z0-9._-]"));
            }
        }
        if self.amount <= 0 {
            return Err(format!("amount {} is not positive", self.amount));
        }
        if self.currency.len() != 3 || !self.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(format!(
                "currency {:?} is not an ISO 4217 code",
                self.currency
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_are_checked_for_shape() {
        let good = br#"{"merchant":"m-1","trade_no":"T1","order_no":"o.1","amount":1999,"currency":"EUR","event_type":"payment.succeeded","extra":1}"#;
        assert_eq!(Notification::from_json(good).unwrap().amount, 1999);
        for (bad, says) in [
            (
                r#"{"merchant":"m 1","trade_no":"T1","order_no":"o","amount":1,"currency":"EUR","event_type":"e"}"#,
                "merchant",
            ),
            (
                r#"{"merchant":"m","trade_no":"T1","order_no":"o","amount":0,"currency":"EUR","event_type":"e"}"#,
                "amount",
            ),
            (
                r#"{"merchant":"m","trade_no":"T1","order_no":"o","amount":1,"currency":"eur","event_type":"e"}"#,
                "currency",
            ),
            (
                r#"{"merchant":"m","trade_no":"T1","order_no":"o","amount":1.5,"currency":"EUR","event_type":"e"}"#,
                "not a notification",
            ),
        ] {
            let error = Notification::from_json(bad.as_bytes()).unwrap_err();
            assert!(error.contains(says), "{error}");
        }
    }
}
