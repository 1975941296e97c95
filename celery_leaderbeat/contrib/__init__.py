"""Optional integrations with other projects' user interfaces."""
