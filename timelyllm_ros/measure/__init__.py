"""What a run is worth, from the robot's side: per-task records (response, robot waiting, utility) and the
tables, CSV and plots made from them. The simulator, the live demo, bag metrics and the planner's telemetry
all measure with these, so a figure means the same wherever it comes from. Imports only the domain types."""
