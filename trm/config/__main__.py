"""Regenerate config/README.md from the schema and the group table: python -m trm.config"""

from trm.config import CONFIG_DIR, reference_markdown

if __name__ == "__main__":
    (CONFIG_DIR / "README.md").write_text(reference_markdown())
    print(f"wrote {CONFIG_DIR / 'README.md'}")
