"""Example LightningModules and DataModules whose data ships with a package (no download)."""
