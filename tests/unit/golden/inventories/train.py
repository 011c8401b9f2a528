"""The script the golden inventories run: only its name reaches the exports."""
