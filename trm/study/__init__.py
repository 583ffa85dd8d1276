"""Planning the study: experiments at a scale, their groups and guides, costs, the study's docs and its status."""
