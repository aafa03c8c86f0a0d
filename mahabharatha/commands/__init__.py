"""The commands of mahabharatha and the helpers they share."""
