"""What lives on disk, in one place (floor 0: every package may use it): atomic writes and refused folders
(writes), weights files (weights), checkpoints read without running code and their checksums
(checkpoints), one run per output folder (folder_lock), a training stage's folder (stage_folder) and a run
folder that knows whose it is (run_folder)."""
