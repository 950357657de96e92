"""Published results as answers: JSON, text, the merged stack tree and rank groups. Reads nothing live."""
