"""The Locust side of one request and its row: payloads, the users that send them on a schedule, what an
answer yields (failure kind, server time), the step tag, and rows shipped to the master on its clock."""
