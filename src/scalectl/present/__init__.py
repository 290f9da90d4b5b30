"""What people see: tables (:mod:`.tables`), figures (:mod:`.plot`), a finished run's answer
(:mod:`.summary`), and live progress (:mod:`.progress`)."""
