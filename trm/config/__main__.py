"""Regenerate docs/configuration.md from the schema and the group table: python -m trm.config"""

from trm.config import REFERENCE_PATH, reference_markdown

if __name__ == "__main__":
    REFERENCE_PATH.write_text(reference_markdown())
    print(f"wrote {REFERENCE_PATH}")
