"""The two roles, leader and standby, and what they share: the node, the agenda, claiming and sending."""
