"""The kopf operator: thin handlers that validate, render, apply and report."""
