"""A Python initiator of a two-phase message, for the cross-language test the Rust suite runs
(tests/tests/cross_language.rs): ``python message_initiator.py SQLITE_FILE COORDINATOR
CHECK_BACK XID BANK`` places an order (a ledger row) on the file in the message's local
transaction and has the Rust bank at ``BANK`` credit bob 5; ``participant_app.py`` on the same
file at ``CHECK_BACK`` answers the check-backs. Prints the message's status once submitted."""

import sys

import dtx


def main(path, coordinator_url, check_back, xid, bank):
    db = dtx.Sqlite(path)
    coordinator = dtx.Coordinator(coordinator_url)

    def place_order(tx):
        tx.execute(
            "INSERT INTO ledger (xid, branch_id, action, payload) VALUES (?, ?, ?, ?)",
            (xid, "order", "order", b""),
        )

    (coordinator.message(check_back, "orders", xid=xid, check_back_after_s=0.3)
     .branch("credit-bob", bank, "credit", b"bob:5")
     .do_and_submit(db, place_order))
    print(coordinator.wait(xid, timeout_s=20).status, flush=True)
    coordinator.close()
    db.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
