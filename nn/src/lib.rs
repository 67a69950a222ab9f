//! Neural-network modules with PyTorch state_dict names (filled by the nn issue).
